"""Label and field selectors: parse once, match many objects.

Label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`, comma-separated
(all must hold). Field selectors: `path=v`, `path==v`, `path!=v` over the field labels a resource
supports; anything else is a 400, as on a real server ("field label not supported").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from launcher.embedded.types.errors import bad_request
from launcher.embedded.types.resources import Resource

Matcher = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s*\(([^()]*)\)\s*$")
_NOT_EXISTS_RE = re.compile(r"^\s*!\s*([^\s!=(),]+)\s*$")
_EQ_RE = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*([^\s!=(),]+)\s*$")


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside `( )`."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


class LabelSelector:
    """A parsed label selector: call it on an object; `equalities` are its `k=v` requirements
    (what the store's label index can answer without looking at every object)."""

    def __init__(
        self, reqs: list[Callable[[dict[str, str]], bool]], equalities: list[tuple[str, str]]
    ) -> None:
        self._reqs = reqs
        self.equalities = equalities

    def __call__(self, obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(req(labels) for req in self._reqs)


def _equality(text: str) -> tuple[str, str] | None:
    m = _EQ_RE.match(text)
    return (m.group(1), m.group(3)) if m and m.group(2) != "!=" else None


def _requirement(text: str) -> Callable[[dict[str, str]], bool]:
    if m := _SET_RE.match(text):
        key, op = m.group(1), m.group(2)
        values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _NOT_EXISTS_RE.match(text):
        key = m.group(1)
        return lambda labels: key not in labels
    if m := _EQ_RE.match(text):
        key, op, value = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _EXISTS_RE.match(text):
        key = m.group(1)
        return lambda labels: key in labels
    raise bad_request(f"unable to parse requirement: {text.strip()!r}")


def label_matcher(selector: str | None) -> LabelSelector | None:
    """A predicate over objects, or None when the selector selects everything."""
    if not selector or not selector.strip():
        return None
    parts = _split_top_level(selector)
    reqs = [_requirement(part) for part in parts]
    return LabelSelector(reqs, [eq for part in parts if (eq := _equality(part)) is not None])


def field_value(obj: dict[str, Any], path: str) -> str:
    """The string form a field selector compares against; a missing field is ""."""
    if path == "source":  # events: the reporting component lives in source.component
        path = "source.component"
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_FIELD_RE = re.compile(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$")


def _unsupported(res: Resource, path: str) -> str:
    if res.custom:  # the CRD handler's wording
        return f'"{path}" is not a known field selector: only "metadata.name", "metadata.namespace"'
    return f"field label not supported: {path}"


class FieldSelector:
    """A parsed field selector: call it on an object; `equalities` are its `path=value`
    requirements (what the store's field index can answer without looking at every object)."""

    def __init__(self, match: Matcher, equalities: list[tuple[str, str]]) -> None:
        self._match = match
        self.equalities = equalities

    def __call__(self, obj: dict[str, Any]) -> bool:
        return self._match(obj)


def field_matcher(res: Resource, selector: str | None) -> FieldSelector | None:
    if not selector or not selector.strip():
        return None
    allowed = {"metadata.name", "metadata.namespace", *res.field_labels}
    reqs: list[tuple[str, bool, str]] = []
    for part in selector.split(","):
        if not part.strip():
            continue
        m = _FIELD_RE.match(part)
        if not m:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{part}'")
        path, op, value = m.groups()
        if path not in allowed:
            raise bad_request(_unsupported(res, path))
        reqs.append((path, op != "!=", value))

    def match(obj: dict[str, Any]) -> bool:
        return all((field_value(obj, path) == value) == equal for path, equal, value in reqs)

    return FieldSelector(match, [(path, value) for path, equal, value in reqs if equal])


def combine(*matchers: Matcher | None) -> Matcher | None:
    active = [m for m in matchers if m is not None]
    if not active:
        return None
    if len(active) == 1:
        return active[0]
    return lambda obj: all(m(obj) for m in active)
