"""ApiError: a Kubernetes `Status` failure raised by the store and turned into a response by the server.

Codes, reasons and message shapes follow the real API server, because clients (and the reslice
controller) branch on `reason` and sometimes match on the message.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A failed API call; `status()` is the `metav1.Status` body the server sends."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if not self.reason:  # a webhook's refusal may carry none (omitempty upstream)
            del body["reason"]
        if self.details:
            body["details"] = self.details
        return body


def _details(qualified: str, name: str) -> dict[str, Any]:
    plural, _, group = qualified.partition(".")
    return {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural}


def not_found(qualified: str, name: str) -> ApiError:
    """`pods "x" not found`; `qualified` is the plural with its group, e.g. `jobs.batch`."""
    return ApiError(404, "NotFound", f'{qualified} "{name}" not found', details=_details(qualified, name))


def already_exists(qualified: str, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{qualified} "{name}" already exists', details=_details(qualified, name)
    )


def conflict(qualified: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
        details=_details(qualified, name),
    )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


# ErrorBody starts with the words of the error's type (apimachinery util/validation/field), so the
# cause's reason follows from its message; a type error says "Invalid value" too and passes its own.
_CAUSE_REASONS = (
    ("Required value", "FieldValueRequired"),
    ("Unsupported value", "FieldValueNotSupported"),
    ("Duplicate value", "FieldValueDuplicate"),
    ("Forbidden", "FieldValueForbidden"),
    ("Too long", "FieldValueTooLong"),
    ("Too many", "FieldValueTooMany"),
    ("Not found", "FieldValueNotFound"),
    ("Internal error", "InternalError"),
)
TYPE_INVALID = "FieldValueTypeInvalid"

Cause = tuple[str, str] | tuple[str, str, str]


def _cause_reason(message: str) -> str:
    return next((r for words, r in _CAUSE_REASONS if message.startswith(words)), "FieldValueInvalid")


def invalid(qualified_kind: str, name: str, causes: list[Cause]) -> ApiError:
    """422 Invalid as apimachinery's errors.NewInvalid writes it: `qualified_kind` is the kind with
    its group (`JobSet.jobset.x-k8s.io`, `Job.batch`, `Pod`); each cause is (field, message) or
    (field, message, reason). The message aggregates the causes as utilerrors.NewAggregate does:
    one as is, several deduplicated in brackets."""
    kind, _, group = qualified_kind.partition(".")
    items = [(c[0], c[1], c[2] if len(c) > 2 else _cause_reason(c[1])) for c in causes]
    texts = list(dict.fromkeys(f"{field}: {msg}" for field, msg, _ in items))
    text = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details: dict[str, Any] = {k: v for k, v in (("name", name), ("group", group), ("kind", kind)) if v}
    details["causes"] = [{"reason": r, "message": msg, "field": field} for field, msg, r in items]
    message = f'{qualified_kind} "{name}" is invalid' + (f": {text}" if texts else "")
    return ApiError(422, "Invalid", message, details=details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
