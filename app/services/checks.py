"""Checks of the services' input, and the opaque listing cursor: each raises InvalidInputError naming its field."""

from __future__ import annotations

import base64
import binascii

from postbox.app.services.errors import InvalidInputError
from postbox.settings import QUEUE_NAME_RE
from postbox.states import ALL_STATES

MAX_PAGE = 500
MAX_BIGINT = 2**63 - 1


def encode_cursor(last_id: int) -> str:
    """An opaque cursor: the page continues with ids below ``last_id``."""
    return base64.urlsafe_b64encode(f"v1:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int | None:
    if cursor is None or cursor == "":
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        tag, _, number = text.partition(":")
        value = int(number)
        if tag != "v1" or not 0 < value <= MAX_BIGINT or number != str(value):
            raise ValueError(text)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidInputError("cursor is not one this API returned", field="cursor") from None
    return value


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInputError(f"limit must be an integer 1-{MAX_PAGE}", field="limit")
    return limit


def check_queue_name(queue: str, field: str = "queue") -> str:
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        raise InvalidInputError(f"invalid queue name {queue!r}: must match {QUEUE_NAME_RE.pattern}", field=field)
    return queue


def check_state(state: str) -> str:
    if state not in ALL_STATES:
        raise InvalidInputError(f"unknown state {state!r}: one of {', '.join(ALL_STATES)}", field="state")
    return state


def check_text(value: str, field: str, max_len: int = 200) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= max_len or "\x00" in value:
        raise InvalidInputError(f"{field} must be 1-{max_len} characters without NUL", field=field)
    return value


def check_job_id(job_id: int) -> int:
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 < job_id <= MAX_BIGINT:
        raise InvalidInputError(f"job id must be an integer 1-{MAX_BIGINT}", field="id")
    return job_id
