"""How the services' results are shaped: frozen dataclasses, a page of them, and their JSON form."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a newest-first listing; ``next_cursor`` continues it (None: no more)."""

    items: list[T]
    next_cursor: str | None


def as_dict(result: Any) -> dict[str, Any]:
    """A result as the API's and the CLI's JSON show it: its fields in order, nested results as dicts."""
    return dataclasses.asdict(result)


def page(rows: Sequence[T], limit: int, last_id: Callable[[T], int], encode: Callable[[int], str]) -> Page[T]:
    """The first ``limit`` of ``rows`` (one more was read: it says whether a next page exists)."""
    items = list(rows[:limit])
    more = len(rows) > limit
    return Page(items=items, next_cursor=encode(last_id(items[-1])) if more and items else None)
