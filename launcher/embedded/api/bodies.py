"""Request bodies and parameters as the API server reads them: what Go's decoders refuse is a 400.

- JSON as encoding/json reads it: no NaN or Infinity, no number beyond float64, nesting at most
  `MAX_DEPTH` deep (Go stops at 10,000; no Kubernetes object comes near this limit, which keeps every
  later recursive walk within Python's stack);
- YAML (create and update only) as sigs.k8s.io/yaml converts it to JSON: timestamps stay strings,
  keys become strings;
- a create or update body that is not an object: `the object provided is unrecognized (must be of
  type <Kind>): couldn't get version/kind; json parse error: ...` (apiserver handlers/rest.go);
- DeleteOptions and integer query parameters that do not decode (handlers/delete.go, 400).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml

from launcher.embedded.types import metatypes
from launcher.embedded.types.errors import ApiError, bad_request
from launcher.embedded.types.gotypes import Mismatch, decode, json_kind

MAX_DEPTH = 200
# Query parameter values that mean true (watch, follow, allowWatchBookmarks, orphanDependents...).
TRUE = ("true", "1")
_INT = re.compile(r"^[+-]?[0-9]{1,18}$")

_TYPE_META = (
    'struct { APIVersion string "json:\\"apiVersion,omitempty\\""; Kind string "json:\\"kind,omitempty\\"" }'
)


class Undecodable(ValueError):
    """A body Go's decoder could not read; the message is its error."""


def _constant(name: str) -> Any:
    raise Undecodable(
        f"invalid character '{name[0] if name[0] != '-' else name[1]}' looking for beginning of value"
    )


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise Undecodable(f"json: cannot unmarshal number {text} into Go value of type float64")
    return value


class _YamlLoader(yaml.SafeLoader):
    """YAML 1.1 without timestamps: Go's YAML-to-JSON conversion keeps them as strings."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _jsonable(value: Any) -> Any:
    """A YAML value as JSON: string keys, finite numbers, bytes as text."""
    if isinstance(value, dict):
        return {_key(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise Undecodable(f"json: unsupported value: {value}")
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return "null" if key is None else str(key)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                break
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def load(raw: bytes, yaml_body: bool = False) -> Any:
    """The decoded body; raises Undecodable."""
    try:
        if yaml_body:
            value = _jsonable(yaml.load(raw, Loader=_YamlLoader))
        else:
            value = json.loads(raw, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise Undecodable("exceeded max depth") from None
    except Undecodable:
        raise
    except (ValueError, yaml.YAMLError) as e:
        raise Undecodable(str(e).replace("\n", " ")) from None
    if _depth(value) > MAX_DEPTH:
        raise Undecodable("exceeded max depth")
    return value


def unrecognized(kind: str, raw: bytes, error: str) -> ApiError:
    """A create or update body that is not an object of any kind."""
    summary = raw[:30].decode("utf-8", "replace") if raw[:1] == b"{" else raw[:30].hex()
    more = " ..." if len(raw) > 30 else ""
    return bad_request(
        f"the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; "
        f"json parse error: {error} ({summary or '<empty>'}{more})"
    )


def not_an_object(value: Any) -> str:
    return f"json: cannot unmarshal {json_kind(value)} into Go value of type {_TYPE_META}"


def delete_options(value: Any) -> dict[str, Any]:
    """A DeleteOptions body, decoded; 400 when Go could not decode it."""
    try:
        return decode(value, metatypes.DELETE_OPTIONS)
    except Mismatch as m:
        raise bad_request(m.message()) from None


def int_param(query: dict[str, str], name: str) -> int | None:
    """An integer query parameter (None when absent or empty); 400 when it is not one."""
    text = query.get(name)
    if not text:
        return None
    if not _INT.match(text):
        raise bad_request(f'strconv.ParseInt: parsing "{text}": invalid syntax')
    return int(text)
