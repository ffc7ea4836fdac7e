"""The first step of every write (create, update, status writes, each patch type): decode the object
as the API server decodes it into Go types, and refuse what Go cannot decode the way upstream does.

- create / update (PUT, main resource or status): 400 BadRequest, `<Kind> in version "<v>" cannot be
  handled as a <Kind>: <decoder error>` (apiserver endpoints/handlers/rest.go transformDecodeError);
- patch: 422 Invalid on the field `patch`, `"" is invalid: patch: Invalid value: "<object>": <error>`
  (endpoints/handlers/patch.go: JSON and merge patches show the patched object and encoding/json's
  error, a strategic merge patch shows the patch and the unstructured converter's error).

A built-in kind is decoded whole. Of a custom resource the server decodes only apiVersion, kind and
metadata (apiextensions-apiserver's schemaCoercingDecoder; metadata on its own, so Go's field path
starts at ObjectMeta); its spec and status are the CRD schema's to check (admission.py), and its
webhooks decode it whole again (admission.py, with `jobsettypes.JOBSET`).
"""

from __future__ import annotations

import json
from typing import Any

from launcher.embedded.types import apitypes, metatypes
from launcher.embedded.types.errors import ApiError, bad_request, invalid
from launcher.embedded.types.gotypes import JSON, UNSTRUCTURED, Mismatch, decode
from launcher.embedded.types.resources import Resource

CREATE, UPDATE, PATCH = "create", "update", "patch"


def decode_object(res: Resource, obj: dict[str, Any]) -> None:
    """Decode `obj` in place (nulls settled); raises Mismatch."""
    if not res.custom:
        decode(obj, apitypes.KINDS[res.plural])
        return
    decode(obj, metatypes.CUSTOM_RESOURCE)
    if obj.get("metadata") is not None:
        decode(obj["metadata"], metatypes.OBJECT_META)


def check(
    res: Resource, obj: dict[str, Any], verb: str, patch: Any = None, patch_type: str | None = None
) -> None:
    """Decode `obj` (the body of a create or update, or the result of applying `patch`) in place;
    raise the ApiError upstream answers when Go could not have decoded it."""
    try:
        decode_object(res, obj)
    except Mismatch as m:
        if verb != PATCH:
            raise bad_request(
                f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: {m.message()}'
            ) from None
        raise patch_invalid(obj, m, patch, patch_type) from None


def patch_invalid(patched: Any, m: Mismatch, patch: Any, patch_type: str | None) -> ApiError:
    if patch_type == "strategic":
        shown, words = go_format(patch), m.message(UNSTRUCTURED)
    else:
        shown, words = json.dumps(patched, separators=(",", ":")), m.message(JSON)
    return invalid("", "", [("patch", f"Invalid value: {go_quote(shown)}: {words}")])


def go_quote(text: str) -> str:
    """%q, near enough: a double-quoted string with JSON's escapes."""
    return json.dumps(text, ensure_ascii=False)


def go_format(value: Any) -> str:
    """fmt's %+v of a decoded JSON value (map[string]interface{} and friends)."""
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_format(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_format(v) for v in value) + "]"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
