"""What the operator services refuse with: a code, a message and details, no HTTP status.

The REST API maps each class to its status (``app/api/errors.py``), the admin
CLI to an exit code (``app/admin/common.py``). Nothing is written when one is
raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from postbox.errors import PostboxError, QueueFullError

__all__ = [
    "ConfirmationRequiredError",
    "ConflictError",
    "InvalidInputError",
    "InvalidLimitError",
    "NotFoundError",
    "QueueFullError",
    "ServiceError",
]


class ServiceError(PostboxError):
    """An operation refused; ``code`` names the reason for machines, the message for people."""

    code = "INVALID_REQUEST"

    def __init__(self, message: str, *, field: str | None = None, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.field = field
        self.details: dict[str, Any] = dict(details or {})
        if field is not None:
            self.details.setdefault("field", field)


class InvalidInputError(ServiceError):
    """A value the caller gave is malformed or out of range (``field`` names it)."""

    code = "INVALID_REQUEST"


class InvalidLimitError(InvalidInputError):
    """A limit operation refused for its input (scope, name, values)."""

    code = "INVALID_LIMIT"


class NotFoundError(ServiceError):
    """The job, queue, worker, limit or schedule does not exist."""

    code = "NOT_FOUND"


class ConflictError(ServiceError):
    """The target's state forbids the operation (a finished job cancelled, a dead letter discarded twice)."""

    code = "CONFLICT"


class ConfirmationRequiredError(ServiceError):
    """A destructive operation asked without its confirmation; the details say what it would do."""

    code = "CONFIRMATION_REQUIRED"
