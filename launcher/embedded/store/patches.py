"""The three PATCH formats of the Kubernetes API, applied to plain JSON objects.

- merge: RFC 7386 JSON merge patch (`application/merge-patch+json`), what the python client sends
  for custom objects;
- json: RFC 6902 JSON patch (`application/json-patch+json`);
- strategic: strategic merge patch (`application/strategic-merge-patch+json`), built-in kinds only.
  Lists merge by the key the upstream Go types declare (`patchMergeKey`); lists without one
  (tolerations, taints, containerStatuses, args...) are replaced whole, as upstream does. Directives:
  `$patch: delete|replace|merge`, `$deleteFromPrimitiveList/<field>`, `$retainKeys`,
  `$setElementOrder/<field>` (accepted; order is kept as merged).

A malformed patch document is refused as the API server refuses it (apiserver
endpoints/handlers/patch.go): a JSON patch that is not a list of objects, a merge patch that is not
an object or a list, and a strategic merge patch that is not an object are 400 BadRequest; a JSON
patch operation that does not apply (unknown op, bad path, failed test) is 422 Invalid with the
generic message. A patch whose result Go cannot decode is refused by `decoding` (422 on `patch`).

Inputs are never modified; results share no mutable structure with the patch document.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from launcher.embedded.types.errors import ApiError, bad_request
from launcher.embedded.types.gotypes import json_kind

PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
}

# patchMergeKey of the list fields in the core/v1 and batch/v1 types this server serves.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "ports": "containerPort",  # Service ports use "port": see _merge_key
}
# Lists of scalars with patchStrategy "merge": the patch adds to the set.
_PRIMITIVE_MERGE = {"finalizers"}


MAX_JSON_PATCH_OPERATIONS = 10_000  # apiserver endpoints/handlers/patch.go maxJSONPatchOperations
# What the API server answers for a JSON patch that does not apply (NewGenericServerResponse(422)):
# the library's reason is not passed on.
_REJECTED = "the server rejected our request due to an error in our request"


class _Failed(Exception):
    """A JSON patch operation that does not apply to the document."""


def apply_patch(obj: dict[str, Any], patch: Any, patch_type: str) -> Any:
    """`obj` patched (not necessarily an object: a merge patch that is a list replaces it whole, and
    decoding then refuses it, as upstream); `obj` itself is left as it was."""
    if patch_type == "merge":
        if isinstance(patch, list):
            return copy.deepcopy(patch)
        if not isinstance(patch, dict):
            raise bad_request("Invalid JSON Patch")  # jsonpatch.ErrBadJSONPatch
        return merge_patch(obj, patch)
    if patch_type == "json":
        return json_patch(obj, patch)
    if patch_type == "strategic":
        if patch is None:  # json.Unmarshal of null into the patch map leaves it empty
            patch = {}
        if not isinstance(patch, dict):
            raise bad_request(
                f"json: cannot unmarshal {json_kind(patch)} into Go value of type map[string]interface {{}}"
            )
        return strategic_merge(obj, patch)
    raise ApiError(415, "UnsupportedMediaType", f"the media type {patch_type!r} is not supported")


# ---- RFC 7386 -------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---- RFC 6902, as gopkg.in/evanphx/json-patch.v4 applies it -------------------------------------------

_INDEX = re.compile(r"^(0|[1-9][0-9]*)$")


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise _Failed(f"invalid path {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")] if path else []


def _index(container: list[Any], token: str, *, adding: bool) -> int:
    if token == "-" and adding:
        return len(container)
    if not _INDEX.match(token):
        raise _Failed(f"invalid array index {token!r}")
    i = int(token)
    if i > len(container) or (i == len(container) and not adding):
        raise _Failed(f"array index {i} out of bounds")
    return i


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, adding=False)]
        else:
            raise _Failed(f"doc is missing path: /{'/'.join(tokens)}")
    return node


def _get(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, adding=False)]
    raise _Failed(f"doc is missing key: /{'/'.join(tokens)}")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, adding=True), value)
    else:
        raise _Failed(f"doc is missing path: /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise _Failed("cannot remove the whole document")
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, adding=False)]
    else:
        raise _Failed(f"doc is missing key: /{'/'.join(tokens)}")
    return doc


def _operation(doc: Any, op: dict[str, Any]) -> Any:
    kind, path = op.get("op"), _pointer(op.get("path"))
    value = copy.deepcopy(op.get("value"))  # a missing value is null (Operation.value())
    if kind == "add":
        return _add(doc, path, value)
    if kind == "remove":
        return _remove(doc, path)
    if kind == "replace":
        _get(doc, path)  # must exist
        return _add(_remove(doc, path), path, value) if path else value
    if kind in ("move", "copy"):
        source = _pointer(op.get("from"))
        moved = copy.deepcopy(_get(doc, source))
        return _add(_remove(doc, source) if kind == "move" else doc, path, moved)
    if kind == "test":
        if _get(doc, path) != value:
            raise _Failed(f"testing value {op.get('path')} failed")
        return doc
    raise _Failed(f"Unexpected kind: {kind}")


def json_patch(obj: dict[str, Any], ops: Any) -> Any:
    """Decoding the patch (a list of objects) fails with 400, applying it with 422."""
    if ops is None:  # json.Unmarshal of null into the operations: none
        ops = []
    if not isinstance(ops, list):
        raise bad_request(f"json: cannot unmarshal {json_kind(ops)} into Go value of type jsonpatch.Patch")
    for op in ops:
        if op is not None and not isinstance(op, dict):
            raise bad_request(
                f"json: cannot unmarshal {json_kind(op)} into Go value of type jsonpatch.Operation"
            )
    if len(ops) > MAX_JSON_PATCH_OPERATIONS:
        raise ApiError(
            413,
            "RequestEntityTooLarge",
            f"The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {len(ops)}",
        )
    doc: Any = copy.deepcopy(obj)
    try:
        for op in ops:
            doc = _operation(doc, op or {})
    except _Failed:
        raise ApiError(422, "Invalid", _REJECTED) from None
    return doc


# ---- strategic merge ------------------------------------------------------------------------------


def _strip(value: Any) -> Any:
    """A patch value without directives, for places where nothing is merged into."""
    if isinstance(value, dict):
        return {
            k: _strip(v)
            for k, v in value.items()
            if not k.startswith("$") and v is not None and k != "$patch"
        }
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and v.get("$patch") == "delete")]
    return value


def _merge_key(field: str, items: list[Any]) -> str | None:
    key = _MERGE_KEYS.get(field)
    if key == "containerPort" and any(isinstance(i, dict) and "port" in i for i in items):
        return "port"  # Service ports
    return key


def _merge_list(original: list[Any], patch: list[Any], key: str) -> list[Any]:
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [_strip(p) for p in patch if not (isinstance(p, dict) and p.get("$patch") == "replace")]
    result = list(original)
    for item in patch:
        if not isinstance(item, dict):
            result.append(item)
            continue
        pos = next(
            (i for i, cur in enumerate(result) if isinstance(cur, dict) and cur.get(key) == item.get(key)),
            None,
        )
        if item.get("$patch") == "delete":
            if pos is not None:
                del result[pos]
        elif pos is not None:
            result[pos] = _merge_map(result[pos], item)
        else:
            result.append(_strip(item))
    return result


def _merge_map(original: dict[str, Any], patch: dict[str, Any]) -> Any:
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip(patch)
    result = dict(original)
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        current = result.get(key)
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = _merge_map(current if isinstance(current, dict) else {}, value)
        elif isinstance(value, list) and isinstance(current, list) and key in _PRIMITIVE_MERGE:
            result[key] = current + [v for v in value if v not in current]
        elif isinstance(value, list) and isinstance(current, list) and (mk := _merge_key(key, value)):
            result[key] = _merge_list(current, value, mk)
        else:
            result[key] = _strip(value)
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [v for v in result[field] if v not in value]
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def strategic_merge(obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(_merge_map(obj, patch))
