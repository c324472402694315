"""Why an order or event is refused: one typed error per case, each raised before anything is kept."""

from __future__ import annotations

from typing import Any

from postbox.errors import PostboxError


class OrderError(PostboxError):
    """A request Stagedoor refuses; ``status`` is the HTTP status the API answers with."""

    code = "INVALID_ORDER"
    status = 422

    def __init__(self, message: str, *, field: str | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.details = dict(details or {})
        if field is not None:
            self.details.setdefault("field", field)


class InvalidOrderError(OrderError):
    """Malformed input: seat count out of range, bad email, bad event name or capacity."""


class InvalidEmailError(InvalidOrderError):
    code = "INVALID_EMAIL"


class UnknownEventError(OrderError):
    code = "UNKNOWN_EVENT"
    status = 404


class NotEnoughSeatsError(OrderError):
    code = "NOT_ENOUGH_SEATS"
    status = 409
