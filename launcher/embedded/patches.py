"""The three PATCH formats of the Kubernetes API, applied to plain JSON objects.

- merge: RFC 7386 JSON merge patch (`application/merge-patch+json`), what the python client sends
  for custom objects;
- json: RFC 6902 JSON patch (`application/json-patch+json`);
- strategic: strategic merge patch (`application/strategic-merge-patch+json`), built-in kinds only.
  Lists merge by the key the upstream Go types declare (`patchMergeKey`); lists without one
  (tolerations, taints, containerStatuses, args...) are replaced whole, as upstream does. Directives:
  `$patch: delete|replace|merge`, `$deleteFromPrimitiveList/<field>`, `$retainKeys`,
  `$setElementOrder/<field>` (accepted; order is kept as merged).

Inputs are never modified; results share no mutable structure with the patch document.
"""

from __future__ import annotations

import copy
from typing import Any

from launcher.embedded.errors import ApiError, bad_request

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


def _invalid(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def apply_patch(obj: dict[str, Any], patch: Any, patch_type: str) -> dict[str, Any]:
    """`obj` patched; `obj` itself is left as it was."""
    if patch_type == "merge":
        if not isinstance(patch, dict):
            raise bad_request("merge patch must be a JSON object")
        return merge_patch(obj, patch)
    if patch_type == "json":
        return json_patch(obj, patch)
    if patch_type == "strategic":
        if not isinstance(patch, dict):
            raise bad_request("strategic merge patch must be a JSON object")
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


# ---- RFC 6902 -------------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _invalid(f"json patch path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, *, adding: bool) -> int:
    if token == "-" and adding:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise _invalid(f"invalid array index {token!r}")
    i = int(token)
    if i > len(container) or (i == len(container) and not adding):
        raise _invalid(f"array index {i} out of bounds")
    return i


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise _invalid(f"doc is missing path: /{'/'.join(tokens)}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, adding=False)]
        else:
            raise _invalid(f"doc is missing path: /{'/'.join(tokens)}")
    return node


def _get(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _invalid(f"doc is missing key: /{'/'.join(tokens)}")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, adding=False)]
    raise _invalid(f"doc is missing path: /{'/'.join(tokens)}")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, adding=True), value)
    else:
        raise _invalid(f"doc is missing path: /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise _invalid("cannot remove the whole document")
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _invalid(f"doc is missing key: /{'/'.join(tokens)}")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, adding=False)]
    else:
        raise _invalid(f"doc is missing path: /{'/'.join(tokens)}")
    return doc


def json_patch(obj: dict[str, Any], ops: Any) -> dict[str, Any]:
    if not isinstance(ops, list):
        raise bad_request("json patch must be a JSON array of operations")
    doc: Any = copy.deepcopy(obj)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation: {op!r}")
        kind, path = op["op"], _pointer(op["path"])
        if kind in ("add", "replace", "test") and "value" not in op:
            raise bad_request(f"json patch operation {kind!r} needs a value")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            doc = _add(_remove(doc, path), path, copy.deepcopy(op["value"])) if path else op["value"]
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise _invalid(f"testing value {op['path']} failed")
        else:
            raise bad_request(f"unexpected json patch operation {kind!r}")
    if not isinstance(doc, dict):
        raise _invalid("json patch result is not an object")
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
