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


def invalid(kind: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 with one cause per (field, message), shaped like the API server's field errors."""
    text = "; ".join(f"{field}: {msg}" if field else msg for field, msg in causes)
    details = {
        "name": name,
        "kind": kind,
        "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": field} for field, msg in causes],
    }
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details=details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
