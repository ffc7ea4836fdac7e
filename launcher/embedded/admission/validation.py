"""Names, labels and object metadata, validated on every write (the kinds' own rules: rules.py).

Messages are the API server's (apimachinery `validation.IsDNS1123Label` & co.), so a name that a
real cluster would reject (a too-long run name in a label, a JobSet name starting with a digit)
is rejected here with the same words.
"""

from __future__ import annotations

import re
from typing import Any

from launcher.embedded.types.errors import Cause
from launcher.embedded.types.resources import Resource

Causes = list[Cause]

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(f"^{_LABEL}$")
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

_MSG_1123_LABEL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_MSG_1123_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_MSG_1035_LABEL = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
    "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_TOO_LONG_63 = "must be no more than 63 characters"


def dns1123_label(value: str) -> list[str]:
    errs = [_TOO_LONG_63] if len(value) > 63 else []
    return errs + ([] if _DNS1123_LABEL.match(value) else [_MSG_1123_LABEL])


def dns1123_subdomain(value: str) -> list[str]:
    errs = ["must be no more than 253 characters"] if len(value) > 253 else []
    return errs + ([] if _DNS1123_SUBDOMAIN.match(value) else [_MSG_1123_SUBDOMAIN])


def dns1035_label(value: str) -> list[str]:
    errs = [_TOO_LONG_63] if len(value) > 63 else []
    return errs + ([] if _DNS1035_LABEL.match(value) else [_MSG_1035_LABEL])


_GROUP_VERSION = re.compile(r"^([^/]+/)?[^/]+$")  # schema.ParseGroupVersion with a version

_NAME_RULES = {"namespaces": dns1123_label, "services": dns1035_label}


def _qualified_name(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    errs = []
    if "/" in key and (not prefix or dns1123_subdomain(prefix)):
        errs.append("prefix part " + (dns1123_subdomain(prefix) or ["must be non-empty"])[0])
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part " + _TOO_LONG_63)
    elif not _QUALIFIED_NAME.match(name):
        errs.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
            "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
            "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        )
    return errs


def _label_value(value: Any) -> list[str]:
    if not isinstance(value, str):
        return ["must be a string"]
    errs = [_TOO_LONG_63] if len(value) > 63 else []
    if not _LABEL_VALUE.match(value):
        errs.append(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
            "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
            "'my_value',  or '12345', regex used for validation is "
            "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        )
    return errs


def label_value_errors(value: Any) -> list[str]:
    """IsValidLabelValue's messages."""
    return _label_value(value)


def labels(labels: Any, field: str) -> Causes:
    causes: Causes = []
    for key, value in (labels or {}).items():
        causes += [(field, f'Invalid value: "{key}": {m}') for m in _qualified_name(key)]
        causes += [(field, f'Invalid value: "{value}": {m}') for m in _label_value(value)]
    return causes


def object_meta(res: Resource, obj: dict[str, Any]) -> Causes:
    meta = obj["metadata"]
    name = meta.get("name", "")
    rule = _NAME_RULES.get(res.plural, dns1123_subdomain)
    causes = [("metadata.name", f'Invalid value: "{name}": {m}') for m in rule(name)]
    return causes + labels(meta.get("labels"), "metadata.labels") + owner_references(meta)


def owner_references(meta: dict[str, Any]) -> Causes:
    """apimachinery api/validation ValidateOwnerReferences."""
    causes: Causes = []
    refs = meta.get("ownerReferences") or []
    controllers = [f"{r.get('kind', '')}/{r.get('name', '')}" for r in refs if r.get("controller")]
    for i, ref in enumerate(refs):
        field = f"metadata.ownerReferences[{i}]"
        api_version = ref.get("apiVersion") or ""
        if not api_version:
            causes.append((f"{field}.apiVersion", "Required value: must not be empty"))
        elif not _GROUP_VERSION.match(api_version):
            causes.append(
                (
                    f"{field}.apiVersion",
                    f'Invalid value: "{api_version}": must be <group>/<version> or <version>',
                )
            )
        causes += [
            (f"{field}.{k}", "Required value: must not be empty")
            for k in ("kind", "name", "uid")
            if not ref.get(k)
        ]
    if len(controllers) > 1:
        causes.append(
            (
                "metadata.ownerReferences",
                'Invalid value: "array": Only one reference can have Controller set to true. '
                f'Found "true" in references for {controllers[0]} and {controllers[1]}',
            )
        )
    return causes
