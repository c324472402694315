"""Text that every store and log accepts: no lone surrogates, no NUL characters.

Python strings may hold what UTF-8 cannot encode: lone surrogates (a file name
that is not UTF-8, decoded with ``surrogateescape``, as ``os.listdir`` returns
it) make psycopg, orjson and Redis refuse the text; PostgreSQL refuses NUL
characters in ``text`` and ``jsonb``. :func:`safe_text` writes a lone
surrogate as its escape (``\\udcff``, still readable) and drops NULs.
"""

from __future__ import annotations

import traceback
from typing import Any

MAX_DEPTH = 64  # deeper structures in a result are stored as their repr
MAX_TRACEBACK_CHARS = 8_000  # the end of a traceback, where the raising frame is


def safe_text(text: str) -> str:
    """``text`` with lone surrogates escaped and NUL characters removed (cheap when clean)."""
    if text.isascii():
        return text.replace("\x00", "") if "\x00" in text else text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "") if "\x00" in text else text


def safe_value(value: Any, depth: int = 0) -> Any:
    """A JSON-able copy of ``value`` with every string (keys too) made safe.

    Integers beyond 64 bits become strings (JSON encoders and ``jsonb``
    consumers disagree on them); anything else not JSON-native becomes its repr.
    """
    if isinstance(value, str):
        return safe_text(value)
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else str(value)
    if depth >= MAX_DEPTH:
        return safe_text(repr(value))
    if isinstance(value, dict):
        return {safe_text(str(k)): safe_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe_value(v, depth + 1) for v in value]
    return safe_text(repr(value))


def traceback_text(exc: BaseException) -> str:
    """``exc``'s formatted traceback: safe text, its last MAX_TRACEBACK_CHARS characters."""
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:  # a broken __str__ or __traceback__: the class is still worth keeping
        text = f"{type(exc).__name__} (its traceback could not be formatted)\n"
    text = safe_text(text)
    if len(text) > MAX_TRACEBACK_CHARS:
        cut = len(text) - MAX_TRACEBACK_CHARS
        text = f"… ({cut} characters cut)\n" + text[cut:]
    return text
