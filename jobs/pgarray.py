"""PostgreSQL array literals for the hot batched statements, built in one ``str.join``.

psycopg adapts a Python list element by element in Python (about 0.5 µs per
element here), and a worker's outcome batch sends nine arrays per job. These
helpers build the array's text literal at C speed instead; the statements cast
the parameter (``%(ids)s::int8[]``), so PostgreSQL parses the same literal it
would have received. Only values that need no quoting are accepted: numbers,
and words of ``[A-Za-z0-9_.:-]`` (job states, stream entry ids).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

_WORDS = re.compile(r"[A-Za-z0-9_.:,-]*")  # the joined literal; ',' only as the separator


def ints(values: Iterable[int]) -> str:
    """``{1,2,3}`` for an ``int8[]`` / ``int4[]`` cast."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def floats(values: Iterable[float | None]) -> str:
    """``{0.5,NULL}`` for a ``float8[]`` cast; finite numbers or None."""
    out = []
    for value in values:
        if value is None:
            out.append("NULL")
        elif isinstance(value, int | float) and math.isfinite(value):
            out.append(repr(float(value)))
        else:
            raise ValueError(f"not a finite number: {value!r}")
    return "{" + ",".join(out) + "}"


def words(values: Iterable[str]) -> str:
    """``{succeeded,retrying}`` for a ``text[]`` cast; each value a non-empty word, never NULL."""
    items = list(values)
    body = ",".join(items)
    if not _WORDS.fullmatch(body) or any(not item or "," in item or item.upper() == "NULL" for item in items):
        raise ValueError(f"not plain words: {items!r}")
    return "{" + body + "}"


def words_or_null(values: Iterable[str | None]) -> str:
    """``{1-0,NULL}`` for a ``text[]`` cast: plain words as :func:`words`, None as NULL."""
    items = list(values)
    present = [item for item in items if item is not None]
    words(present)  # the same check
    return "{" + ",".join("NULL" if item is None else item for item in items) + "}"


def texts_or_null(values: list[str | None]) -> list[str | None] | None:
    """None (SQL NULL: every element NULL) when no value is set, else the list for psycopg to adapt."""
    return None if all(value is None for value in values) else values
