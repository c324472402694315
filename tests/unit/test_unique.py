"""The uniqueness rule's declaration: validation, the published rule, JobId (pure)."""

from __future__ import annotations

import math
import pickle
from typing import Any

import orjson
import pytest

import postbox
from postbox.errors import InvalidOptionError
from postbox.producer import JobId, prepare
from postbox.registry import Registry, task
from postbox.states import JobState
from postbox.unique import Unique, rule_json


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({}, "unique", "needs a period, states, or both"),
        ({"by": ("a",)}, "unique", "needs a period, states, or both"),
        ({"period": 0}, "unique.period", "must be > 0"),
        ({"period": -5}, "unique.period", "must be > 0"),
        ({"period": math.nan}, "unique.period", "must be > 0"),
        ({"period": math.inf}, "unique.period", "must be > 0"),
        ({"period": 367 * 86_400}, "unique.period", "at most"),
        ({"period": True}, "unique.period", "number of seconds"),
        ({"period": "1h"}, "unique.period", "number of seconds"),
        ({"states": ()}, "unique.states", "must not be empty"),
        ({"states": ("pending", "done")}, "unique.states", "'done' is not a job state"),
        ({"states": ("pending", "pending")}, "unique.states", "names something twice"),
        ({"states": 5}, "unique.states", "tuple of names"),
        ({"period": 1, "by": ()}, "unique.by", "must not be empty"),
        ({"period": 1, "by": ("a", "")}, "unique.by", "not a name"),
        ({"period": 1, "by": ("a", 1)}, "unique.by", "not a name"),
        ({"period": 1, "by": {"a": 1}}, "unique.by", "tuple of names"),
        ({"period": 1, "by": tuple(f"a{i}" for i in range(33))}, "unique.by", "at most 32"),
    ],
)
def test_bad_values_raise_a_typed_error(kwargs: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message) as info:
        Unique(**kwargs)
    assert info.value.field == field
    assert info.value.code == "INVALID_OPTION"


def test_values_are_normalised() -> None:
    rule = Unique(period=60, states=[JobState.PENDING, "running"], by="customer_id")  # type: ignore[arg-type]
    assert rule == Unique(period=60.0, states=("pending", "running"), by=("customer_id",))
    assert type(rule.states[0]) is str and type(rule.period) is float  # type: ignore[index]
    assert hash(rule) == hash(Unique(period=60.0, states=("pending", "running"), by=("customer_id",)))


def test_the_published_rule_holds_the_defaults_of_the_key_arguments() -> None:
    reg = Registry()

    @task(registry=reg, unique=Unique(states=("pending",), by=("a", "lang", "tags")))
    def t(ctx: Any, a: int, lang: str = "en", tags: list[str] = [], other: int = 3) -> None: ...  # noqa: B006

    @task(registry=reg, unique=Unique(period=10))
    def every(ctx: Any, a: int, lang: str = "en", when: Any = object()) -> None: ...

    assert orjson.loads(reg.get("t").unique_rule or "") == {
        "period": None,
        "states": ["pending"],
        "by": ["a", "lang", "tags"],
        "defaults": {"lang": "en", "tags": []},
    }
    # by None: every argument; a default that is not JSON is left out.
    assert orjson.loads(reg.get("every").unique_rule or "")["defaults"] == {"lang": "en"}
    assert rule_json(None, reg.get("t").args_model) is None


def test_a_key_argument_must_be_an_argument_of_the_handler() -> None:
    reg = Registry()
    with pytest.raises(InvalidOptionError, match="unique by 'b'") as info:

        @task(registry=reg, unique=Unique(period=1, by=("a", "b")))
        def t(ctx: Any, a: int) -> None: ...

    assert info.value.details["unknown"] == ["b"]
    assert len(reg) == 0

    @task(registry=reg, unique=Unique(period=1, by=("anything",)))
    def loose(ctx: Any, **kwargs: Any) -> None: ...  # takes any argument: any name may be in the key

    assert "loose" in reg


def test_prepare_carries_the_rule_and_no_key_yet() -> None:
    reg = Registry()

    @task(registry=reg, unique=Unique(period=5))
    def t(ctx: Any, a: int) -> None: ...

    @task(registry=reg)
    def plain(ctx: Any) -> None: ...

    row = prepare(t, {"a": 1}, registry=reg)
    assert row.unique_rule == reg.get("t").unique_rule and row.unique_key is None
    assert row.params()["unique_key"] is None
    assert prepare(plain, registry=reg).unique_rule is None


def test_job_id_is_an_int_with_a_duplicate_flag() -> None:
    new, dup = JobId(7), JobId(7, duplicate=True)
    assert (new, new.duplicate, dup.duplicate) == (7, False, True)
    assert isinstance(dup, int) and dup == 7 and hash(dup) == hash(7)
    assert (str(dup), f"{dup}", repr(dup), orjson.dumps({"id": dup})) == ("7", "7", "7", b'{"id":7}')
    back = pickle.loads(pickle.dumps(dup))
    assert (back, back.duplicate) == (7, True)
    assert postbox.JobId is JobId and postbox.Unique is Unique
