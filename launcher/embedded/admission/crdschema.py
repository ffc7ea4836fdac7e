"""The JobSet CRD's own checks, as the API server applies them from the CRD
(`crds/jobset.x-k8s.io_jobsets.yaml`, upstream's v0.12.0 release file with a header naming its
source and license): structural pruning and nulls dropped, the schema's `default:` values, the
`openAPIV3Schema` (jsonschema; a wrong type is a FieldValueTypeInvalid cause, as
apiextensions-apiserver's kubeOpenAPIResultToFieldErrors writes it) and the CEL `self == oldSelf`
transition rules.

Steps 1, 2 and 4 of `admission.py`, which calls it; tests read `crd_schema` for the schema.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from launcher.embedded.admission.validation import Causes
from launcher.embedded.types.errors import TYPE_INVALID, Cause

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "crds"
CRD_FILE = "jobset.x-k8s.io_jobsets.yaml"


@functools.cache
def crd_schema(schema_dir: Path = SCHEMA_DIR) -> dict[str, Any]:
    path = schema_dir / CRD_FILE
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@functools.cache
def _validator(schema_dir: Path = SCHEMA_DIR, part: str | None = None) -> Any:
    """The schema's validator (of the whole object, or of one top-level `part` of it)."""
    import jsonschema  # a second of import time saved for servers that never see a JobSet

    schema: dict[str, Any] | None = crd_schema(schema_dir)
    if part is not None:
        schema = ((schema or {}).get("properties") or {}).get(part)
    if schema is None:
        return None
    # kube-openapi's type validator takes an integral float for an integer (isFloatInt).
    checker = jsonschema.Draft4Validator.TYPE_CHECKER.redefine(
        "integer",
        lambda _, v: (
            not isinstance(v, bool) and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
        ),
    )
    return jsonschema.validators.extend(jsonschema.Draft4Validator, type_checker=checker)(schema)


@functools.cache
def _immutable_paths(schema_dir: Path = SCHEMA_DIR) -> tuple[tuple[str, ...], ...]:
    """Paths carrying the CEL transition rule `self == oldSelf`; "*" stands for list items."""
    found: list[tuple[str, ...]] = []

    def walk(node: dict[str, Any], path: tuple[str, ...]) -> None:
        if any(v.get("rule") == "self == oldSelf" for v in node.get("x-kubernetes-validations") or []):
            found.append(path)
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, (*path, key))
        if isinstance(node.get("items"), dict):
            walk(node["items"], (*path, "*"))

    walk(crd_schema(schema_dir), ())
    return tuple(found)


# ---- steps 1 and 2: pruning, nulls, schema defaults ------------------------------------------------


def drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value if v is not None]
    return value


def prune_and_default(value: Any, schema: dict[str, Any], top: bool = False) -> Any:
    """Unknown fields dropped and `default:` values filled in, as for a structural schema."""
    if isinstance(value, dict):
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        out = {}
        for key, sub in value.items():
            if top and key in ("apiVersion", "kind", "metadata"):
                out[key] = sub
            elif props is not None and key in props:
                out[key] = prune_and_default(sub, props[key])
            elif isinstance(additional, dict):
                out[key] = prune_and_default(sub, additional)
            elif schema.get("x-kubernetes-preserve-unknown-fields") or (
                props is None and additional is not False
            ):
                out[key] = sub
        for key, sub in (props or {}).items():
            if key not in out and "default" in sub:
                out[key] = prune_and_default(copy.deepcopy(sub["default"]), sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_and_default(v, schema["items"]) for v in value]
    return value


# ---- step 4: validation -----------------------------------------------------------------------------


def _field(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "object"}


def schema_causes(js: Any, schema_dir: Path = SCHEMA_DIR, part: str | None = None) -> list[Cause]:
    """Schema violations of the object (or of its top-level `part`, when `js` is that part)."""
    validator = _validator(schema_dir, part)
    if validator is None:
        return []
    causes: list[Cause] = []
    for err in sorted(validator.iter_errors(js), key=lambda e: list(map(str, e.absolute_path))):
        field = _field([part, *err.absolute_path] if part else err.absolute_path)
        if err.validator == "type":
            # kube-openapi's InvalidType: the bad value is the JSON type the data has.
            got = _JSON_TYPES.get(type(err.instance), "null")
            expected = (
                err.validator_value if isinstance(err.validator_value, str) else ",".join(err.validator_value)
            )
            msg = f'Invalid value: "{got}": {field} in body must be of type {expected}: "{got}"'
            causes.append((field, msg, TYPE_INVALID))
        elif err.validator == "required":
            missing = err.message.split("'")[1]
            causes.append((f"{field}.{missing}" if field else missing, "Required value"))
        elif err.validator == "enum":
            allowed = ", ".join(f'"{v}"' for v in err.validator_value)
            causes.append((field, f'Unsupported value: "{err.instance}": supported values: {allowed}'))
        else:
            causes.append((field, f"Invalid value: {_short(err.instance)}: {field} in body {_reason(err)}"))
    return causes


def _short(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict | list):
        return f'"{type(value).__name__ if isinstance(value, list) else "object"}"'
    return str(value).lower() if isinstance(value, bool) else str(value)


def _reason(err: Any) -> str:
    words = {
        "type": f"must be of type {err.validator_value}",
        "minimum": f"should be greater than or equal to {err.validator_value}",
        "maximum": f"should be less than or equal to {err.validator_value}",
        "maxItems": f"must have at most {err.validator_value} items",
        "minItems": f"should have at least {err.validator_value} items",
        "maxLength": f"may not be longer than {err.validator_value}",
        "minLength": f"should be at least {err.validator_value} chars long",
        "pattern": f"should match '{err.validator_value}'",
    }
    return words.get(err.validator, err.message)


def _values_at(obj: Any, path: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    """Values at a schema path; list items keyed by their `name` (the list-map key) or index."""
    if not path:
        return {prefix: obj}
    head, rest = path[0], path[1:]
    out: dict[str, Any] = {}
    if head == "*" and isinstance(obj, list):
        for i, item in enumerate(obj):
            key = item.get("name", i) if isinstance(item, dict) else i
            out.update(_values_at(item, rest, f"{prefix}[{key}]"))
    elif isinstance(obj, dict) and head in obj:
        out.update(_values_at(obj[head], rest, f"{prefix}.{head}" if prefix else head))
    return out


def cel_update_causes(old: dict[str, Any], new: dict[str, Any], schema_dir: Path = SCHEMA_DIR) -> Causes:
    """The CRD's `self == oldSelf` transition rules (checked by the API server with the schema)."""
    causes: Causes = []
    for path in _immutable_paths(schema_dir):
        before, after = _values_at(old, path), _values_at(new, path)
        for field, value in after.items():
            if field in before and before[field] != value:
                causes.append((field, 'Invalid value: "object": Value is immutable'))
    return causes
