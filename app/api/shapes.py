"""The API's response models, derived from the services' result dataclasses.

A service declares a result's fields once, as a frozen dataclass (the CLI prints
the same one); a route answers with :func:`response_model` of it: a pydantic
model of the same fields, in the same order, under the name the OpenAPI schema
shows. ``omit`` leaves out a field the API does not show; ``nested`` names the
response model that stands for a nested result (or for a type variable of a
generic one, such as ``Page``'s items), so that the schema refers to it.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel, create_model


def response_model(
    source: type[Any],
    name: str,
    *,
    omit: Collection[str] = (),
    nested: Mapping[Any, type[BaseModel]] | None = None,
) -> type[BaseModel]:
    """A pydantic model named ``name`` with the fields of the dataclass ``source`` (less ``omit``)."""
    if not dataclasses.is_dataclass(source):
        raise TypeError(f"{source!r} is not a dataclass")
    unknown = set(omit) - {f.name for f in dataclasses.fields(source)}
    if unknown:
        raise ValueError(f"{source.__name__} has no field {', '.join(sorted(unknown))}")
    hints = typing.get_type_hints(source)
    swap = nested or {}
    fields: dict[str, Any] = {
        f.name: (_substitute(hints[f.name], swap), ...) for f in dataclasses.fields(source) if f.name not in omit
    }
    return create_model(name, **fields)


def _substitute(hint: Any, swap: Mapping[Any, type[BaseModel]]) -> Any:
    """``hint`` with every type (or type variable) in ``swap`` replaced, however deep it stands."""
    if hint in swap:
        return swap[hint]
    args = typing.get_args(hint)
    if not args:
        return hint
    replaced = tuple(_substitute(arg, swap) for arg in args)
    if replaced == args:
        return hint
    origin = typing.get_origin(hint)
    if origin is types.UnionType or origin is typing.Union:
        return functools.reduce(operator.or_, replaced)
    return origin[replaced]


def list_of(model: type[BaseModel]) -> Any:
    """``list[model]``, for a model made by :func:`response_model` (mypy takes no variable for a type)."""
    return types.GenericAlias(list, (model,))
