"""The API's response models derived from the services' dataclasses (postbox.app.api.shapes)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from postbox.app.api.shapes import list_of, response_model
from postbox.app.services.results import Page
from postbox.app.services.results import T as Item


@dataclass(frozen=True)
class Leaf:
    id: int
    at: datetime | None


@dataclass(frozen=True)
class Tree:
    leaf: Leaf
    leaves: list[Leaf]
    maybe: Leaf | None
    secret: dict[str, Any]


def test_fields_in_order_all_required_under_the_given_name() -> None:
    LeafOut = response_model(Leaf, "LeafOut")
    schema = LeafOut.model_json_schema()
    assert schema["title"] == "LeafOut"
    assert list(schema["properties"]) == ["id", "at"]
    assert schema["required"] == ["id", "at"]
    assert "description" not in schema
    with pytest.raises(ValidationError):
        LeafOut.model_validate({"id": 1})


def test_omitted_fields_are_dropped_from_the_schema_and_the_answer() -> None:
    TreeOut = response_model(Tree, "TreeOut", omit={"secret"}, nested={Leaf: response_model(Leaf, "LeafOut")})
    assert list(TreeOut.model_json_schema()["properties"]) == ["leaf", "leaves", "maybe"]
    leaf = {"id": 1, "at": None}
    dumped = TreeOut.model_validate({"leaf": leaf, "leaves": [leaf], "maybe": None, "secret": {"k": 1}}).model_dump()
    assert dumped == {"leaf": leaf, "leaves": [leaf], "maybe": None}


def test_nested_results_refer_to_their_response_models_however_deep() -> None:
    LeafOut = response_model(Leaf, "LeafOut")
    TreeOut = response_model(Tree, "TreeOut", nested={Leaf: LeafOut})
    schema = TreeOut.model_json_schema()
    assert list(schema["$defs"]) == ["LeafOut"]
    assert schema["properties"]["leaf"] == {"$ref": "#/$defs/LeafOut"}
    assert schema["properties"]["leaves"]["items"] == {"$ref": "#/$defs/LeafOut"}
    assert schema["properties"]["maybe"]["anyOf"] == [{"$ref": "#/$defs/LeafOut"}, {"type": "null"}]


def test_a_generic_page_takes_its_items_model_for_the_type_variable() -> None:
    LeafOut = response_model(Leaf, "LeafOut")
    LeafPage = response_model(Page, "LeafPage", nested={Item: LeafOut})
    at = datetime(2026, 1, 2, tzinfo=UTC)
    parsed = LeafPage.model_validate({"items": [{"id": 3, "at": at}], "next_cursor": None})
    assert parsed.model_dump() == {"items": [{"id": 3, "at": at}], "next_cursor": None}
    assert LeafPage.model_json_schema()["properties"]["items"]["items"] == {"$ref": "#/$defs/LeafOut"}


def test_list_of_is_a_list_of_the_model() -> None:
    LeafOut = response_model(Leaf, "LeafOut")
    assert TypeAdapter(list_of(LeafOut)).validate_python([{"id": 1, "at": None}]) == [LeafOut(id=1, at=None)]


def test_a_field_to_omit_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="Leaf has no field nope"):
        response_model(Leaf, "LeafOut", omit={"nope"})


def test_only_a_dataclass_is_taken() -> None:
    with pytest.raises(TypeError, match="is not a dataclass"):
        response_model(dict, "DictOut")
