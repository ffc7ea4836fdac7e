"""What the API server's Go JSON decoding accepts, before defaulting or validation see an object.

A real server decodes a request body into its typed Go objects first: a string where Go has an
int32, a list where it has a struct, fails there, and nothing later runs. Upstream answers such a
create or update with 400 (`Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal
string into Go struct field Container.spec.containers.name of type string`, apiserver
`endpoints/handlers/rest.go` transformDecodeError) and such a patch with 422 on the field `patch`
(`endpoints/handlers/patch.go`). Decoding also settles nulls: a null struct field is the zero value,
which Go then leaves out (`omitempty`), except times (`metav1.Time` encodes its zero as null); a null
list item or map value is the element's zero value.

`decode(value, t)` does the same walk over plain JSON values: it drops and replaces nulls in place
and raises `Mismatch` at the first value Go could not decode, with Go's words for it. The types of
the served kinds are in `apitypes.py` (KINDS, by plural); fields not listed there pass through untouched.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from typing import Any

from launcher.core import rfc3339

# The two decoders whose words upstream's errors carry: encoding/json (create, update, JSON and
# merge patch) and runtime.DefaultUnstructuredConverter (strategic merge patch).
JSON, UNSTRUCTURED = "json", "unstructured"


class Mismatch(Exception):
    """The first value Go could not decode, and where: Go's field path (struct fields only)."""

    def __init__(self, value: Any, expected: GoType, detail: str | None = None) -> None:
        super().__init__(detail or expected.go)
        self.value, self.expected, self.detail = value, expected, detail
        self._names: list[str] = []  # innermost first while the walk unwinds
        self.struct: str | None = None  # the innermost struct holding the field, as Go names it

    def field(self, name: str, struct: str) -> Mismatch:
        self._names.append(name)
        if self.struct is None:
            self.struct = struct
        return self

    def message(self, decoder: str = JSON) -> str:
        """The decoder's error text: encoding/json's UnmarshalTypeError, the converter's words, or
        a custom unmarshaler's own error (times, quantities)."""
        if self.detail is not None:
            return self.detail
        if decoder == UNSTRUCTURED:
            return self.expected.converter_error(self.value)
        where = (
            f"Go struct field {self.struct}.{'.'.join(reversed(self._names))}" if self.struct else "Go value"
        )
        return f"json: cannot unmarshal {json_kind(self.value, self.expected)} into {where} of type {self.expected.go}"


def json_kind(value: Any, expected: GoType | None = None) -> str:
    """How encoding/json names a JSON value in an UnmarshalTypeError ("number 1.5" for a number
    that does not fit an integer field)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value!r}" if isinstance(expected, Int) else "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), "value")


def go_kind(value: Any) -> str:
    """reflect.Kind of an unstructured value, as the converter prints it."""
    if isinstance(value, bool):
        return "bool"
    return {str: "string", int: "int64", float: "float64", list: "slice", dict: "map"}.get(type(value), "ptr")


class GoType:
    go = "interface {}"
    keeps_null = False  # null is decoded and encoded as null (metav1.Time), not dropped

    def decode(self, value: Any, lenient: bool) -> Any:
        return value

    def zero(self) -> Any:
        return None

    def converter_error(self, value: Any) -> str:
        return f"unrecognized type: {self.go}"


class Any_(GoType):
    """RawExtension, free-form fields: anything goes."""


class Str(GoType):
    go = "string"

    def decode(self, value: Any, lenient: bool) -> Any:
        if not isinstance(value, str):
            raise Mismatch(value, self)
        return value

    def zero(self) -> Any:
        return ""

    def converter_error(self, value: Any) -> str:
        # An int64 is ConvertibleTo string in Go's reflect (and then refused); the rest is not.
        return (
            f"cannot convert int64 to {self.go}"
            if go_kind(value) == "int64"
            else super().converter_error(value)
        )


class Bool(GoType):
    go = "bool"

    def decode(self, value: Any, lenient: bool) -> Any:
        if not isinstance(value, bool):
            raise Mismatch(value, self)
        return value

    def zero(self) -> Any:
        return False


_PLAIN: dict[type, type] = {Str: str, Bool: bool}


class Int(GoType):
    def __init__(self, bits: int, go: str | None = None) -> None:
        self.go = go or f"int{bits}"
        self.low, self.high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def decode(self, value: Any, lenient: bool) -> Any:
        # A custom resource is decoded as unstructured JSON first (numbers become int64 or float64)
        # and encoded again for the webhooks: an integral float reaches them as an integer.
        if lenient and isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            raise Mismatch(value, self)
        return value

    def zero(self) -> Any:
        return 0

    def converter_error(self, value: Any) -> str:
        if go_kind(value) in ("int64", "float64"):
            return f"cannot convert {go_kind(value)} to {self.go}"
        return super().converter_error(value)


class Struct(GoType):
    def __init__(self, name: str, package: str = "v1", /, **fields: GoType) -> None:
        self.name, self.go, self.fields = name, f"{package}.{name}", fields
        # Strings and booleans are most of an object: their check is a type comparison.
        self._plain = {k: _PLAIN[type(t)] for k, t in fields.items() if type(t) in _PLAIN}

    def decode(self, value: Any, lenient: bool) -> Any:
        if not isinstance(value, dict):
            raise Mismatch(value, self)
        plain, fields, dropped = self._plain, self.fields, None
        for key, sub in value.items():
            if type(sub) is plain.get(key):
                continue
            ft = fields.get(key)
            if ft is None:
                continue
            if sub is None:
                if not ft.keeps_null:
                    dropped = [*(dropped or ()), key]
                continue
            try:
                new = ft.decode(sub, lenient)
            except Mismatch as m:
                raise m.field(key, self.name) from None
            if new is not sub:
                value[key] = new
        for key in dropped or ():
            del value[key]
        return value

    def zero(self) -> Any:
        return {}

    def converter_error(self, value: Any) -> str:
        return f"cannot restore struct from: {go_kind(value)}"


class Slice(GoType):
    def __init__(self, item: GoType) -> None:
        self.item, self.go = item, f"[]{item.go}"

    def decode(self, value: Any, lenient: bool) -> Any:
        if not isinstance(value, list):
            raise Mismatch(value, self)
        plain = _PLAIN.get(type(self.item))
        if plain is not None and all(type(v) is plain for v in value):
            return value
        for i, sub in enumerate(value):
            if sub is None:
                value[i] = self.item.zero()
                continue
            new = self.item.decode(sub, lenient)  # Go's field path has no list indices
            if new is not sub:
                value[i] = new
        return value

    def converter_error(self, value: Any) -> str:
        return f"cannot restore slice from {go_kind(value)}"


class Map(GoType):
    def __init__(self, value: GoType, go: str | None = None) -> None:
        self.value, self.go = value, go or f"map[string]{value.go}"

    def decode(self, value: Any, lenient: bool) -> Any:
        if not isinstance(value, dict):
            raise Mismatch(value, self)
        plain = _PLAIN.get(type(self.value))
        if plain is not None and all(type(v) is plain for v in value.values()):
            return value
        for key, sub in value.items():
            if sub is None:
                value[key] = self.value.zero()
                continue
            new = self.value.decode(sub, lenient)  # nor map keys
            if new is not sub:
                value[key] = new
        return value

    def converter_error(self, value: Any) -> str:
        return f"cannot restore map from {go_kind(value)}"


# ---- types with their own UnmarshalJSON: their errors are theirs, without a field path -------------

_RFC3339 = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$"
)


def parse_time(value: str) -> dt.datetime | None:
    """time.Parse(time.RFC3339, value), or None where Go would refuse it."""
    if not _RFC3339.match(value):
        return None
    try:
        return rfc3339.parse(value)
    except ValueError:  # matches the layout, but no such date or time (month 13)
        return None


class Time(GoType):
    """metav1.Time and MicroTime: an RFC 3339 string, or null."""

    keeps_null = True

    def __init__(self, go: str = "v1.Time") -> None:
        self.go = go

    def decode(self, value: Any, lenient: bool) -> Any:
        if not isinstance(value, str):
            raise Mismatch(
                value, self, f"json: cannot unmarshal {json_kind(value)} into Go value of type string"
            )
        if parse_time(value) is None:
            raise Mismatch(
                value,
                self,
                f'parsing time "{value}" as "2006-01-02T15:04:05Z07:00": cannot parse "{value}" as "2006"',
            )
        return value


# What resource.ParseQuantity accepts: a signed decimal, then a binary or decimal SI suffix or an
# exponent. The value is kubernetes.utils.parse_quantity's; this only refuses what Go refuses and
# Python's Decimal would take ("NaN", "1_000", " 1").
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
QUANTITY_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


def parse_quantity(value: Any) -> float | None:
    """A resource.Quantity (a JSON string or number) as a float, or None where Go would refuse it."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    from kubernetes.utils import parse_quantity as k8s_quantity  # late: kubernetes.client is slow

    text = str(value).strip()
    m = _QUANTITY.match(text)
    if m is None:
        return None
    suffix = m.group(2) or ""
    if len(suffix) > 1 and suffix[0] in "eE" and abs(int(suffix[1:])) >= 300:  # "E" alone: exa
        return None  # past a float; Go's Quantity would hold it, nothing here needs it
    return float(k8s_quantity(text))


class Quantity(GoType):
    go = "resource.Quantity"

    def zero(self) -> Any:
        return "0"  # Quantity.UnmarshalJSON takes null as the zero quantity

    def decode(self, value: Any, lenient: bool) -> Any:
        if parse_quantity(value) is None:
            raise Mismatch(value, self, QUANTITY_ERROR)
        return value


class IntOrString(GoType):
    go = "intstr.IntOrString"

    def zero(self) -> Any:
        return 0  # IntOrString.UnmarshalJSON decodes null as the integer 0

    def decode(self, value: Any, lenient: bool) -> Any:
        if isinstance(value, str):
            return value
        int32 = Int(32)
        if isinstance(value, bool) or not isinstance(value, int) or not int32.low <= value <= int32.high:
            raise Mismatch(
                value, self, f"json: cannot unmarshal {json_kind(value, int32)} into Go value of type int32"
            )
        return value


class Bytes(GoType):
    """[]byte: base64 in JSON."""

    go = "[]uint8"

    def decode(self, value: Any, lenient: bool) -> Any:
        if not isinstance(value, str):
            raise Mismatch(value, self)
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise Mismatch(value, self, "illegal base64 data at input byte 0") from None
        return value


def decode(value: Any, t: GoType, *, lenient: bool = False) -> Any:
    """`value` as Go decodes it into `t` (nulls settled in place); raises Mismatch."""
    return t.decode(value, lenient)


def _zero(value: Any) -> bool:
    if isinstance(value, bool | int | float):
        return not value
    return value is None or value in ({}, [], "")


def without_zeros(value: Any) -> Any:
    """`value` with every object field whose value is its zero left out (null, `{}`, `[]`, `""`,
    `0`, `false`, and an object or list that is nothing else), at any depth; list items are kept."""
    if isinstance(value, dict):
        out = {k: without_zeros(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if not _zero(v)}
    if isinstance(value, list):
        return [without_zeros(v) for v in value]
    return value


def go_equal(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal once decoded into one Go type and compared as upstream's
    validation compares them (apimachinery `equality.Semantic.DeepEqual`, after the typed
    decoding): a field left out is its zero value, and an empty map or list is a nil one. So a pod
    template created without `metadata` equals one with `metadata: {}`, and `labels: {}` equals
    none. (A pointer field Go tells apart when nil and when zero, say `suspend: false` against no
    `suspend`, is equal here too: never stricter than upstream.)"""
    return without_zeros(a) == without_zeros(b)
