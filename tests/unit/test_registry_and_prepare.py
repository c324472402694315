from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import postbox
from postbox import errors
from postbox import producer as enq
from postbox.registry import Registry, task
from tests.harness.tasks import core as tasks_core

LIMITS = enq.Limits(max_payload_bytes=1024)


def prep(*args, **kwargs):  # type: ignore[no-untyped-def]
    return enq.prepare(*args, limits=LIMITS, **kwargs)


def test_defaults_come_from_the_task() -> None:
    row = prep(tasks_core.send_welcome, {"user_id": 1})
    assert (row.queue, row.priority, row.max_attempts, row.task) == ("mail", 7, 3, "send_welcome")
    assert row.args == '{"user_id":1}'


def test_options_override_the_task() -> None:
    row = prep(
        "send_welcome", {"user_id": "5"}, queue="bulk-mail", priority=0, max_attempts=9, delay=timedelta(seconds=3)
    )
    assert (row.queue, row.priority, row.max_attempts, row.delay) == ("bulk-mail", 0, 9, 3.0)
    assert row.args == '{"user_id":5}'  # validated and coerced by the handler's types


def test_task_by_name_with_custom_name() -> None:
    assert prep("core.sync_add", {"a": 1, "b": 2}).task == "core.sync_add"


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: prep("no_such_task", {}), errors.UnknownTaskError),
        (lambda: prep(print, {}), errors.UnknownTaskError),
        (lambda: prep("noop", {}, queue="Bad Queue"), errors.InvalidQueueError),
        (lambda: prep("noop", {}, queue=""), errors.InvalidQueueError),
        (lambda: prep("noop", {}, queue="a" * 65), errors.InvalidQueueError),
        (lambda: prep("noop", {}, priority=10), errors.InvalidPriorityError),
        (lambda: prep("noop", {}, priority=-1), errors.InvalidPriorityError),
        (lambda: prep("noop", {}, priority=True), errors.InvalidPriorityError),
        (lambda: prep("noop", [1, 2]), errors.InvalidArgsError),  # type: ignore[arg-type]
        (lambda: prep("send_welcome", {"user_id": "x"}), errors.InvalidArgsError),
        (lambda: prep("send_welcome", {}), errors.InvalidArgsError),
        (lambda: prep("send_welcome", {"user_id": 1, "extra": 2}), errors.InvalidArgsError),
        (lambda: prep("send_welcome", {"user_id": 1, "lang": "x" * 2000}), errors.PayloadTooLargeError),
        (lambda: prep("noop", {}, delay=1, run_at=datetime.now(UTC)), errors.ScheduleConflictError),
        (lambda: prep("noop", {}, delay=-1), errors.ScheduleConflictError),
        (lambda: prep("noop", {}, run_at=datetime.now()), errors.ScheduleConflictError),
        (lambda: prep("noop", {}, max_attempts=0), errors.InvalidMaxAttemptsError),
        (lambda: prep("noop", {}, headers={"a": object()}), errors.InvalidOptionError),
        (lambda: prep("noop", {}, dedup_key=""), errors.InvalidOptionError),
    ],
)
def test_bad_input_raises_its_own_type(call, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, postbox.EnqueueError)
    assert info.value.code != postbox.EnqueueError.code


def test_invalid_args_name_the_field() -> None:
    with pytest.raises(errors.InvalidArgsError) as info:
        prep("send_welcome", {"user_id": "x"})
    assert info.value.field == "args.user_id"


def test_registry_rejects_a_second_handler_under_one_name() -> None:
    registry = Registry()

    @task(name="dup", registry=registry)
    async def first(ctx) -> None: ...  # type: ignore[no-untyped-def]

    with pytest.raises(errors.DuplicateTaskError):

        @task(name="dup", registry=registry)
        async def second(ctx) -> None: ...  # type: ignore[no-untyped-def]


def test_task_declaration_is_checked() -> None:
    registry = Registry()
    with pytest.raises(errors.InvalidQueueError):
        task(queue="UPPER", registry=registry)(tasks_core.noop)
    with pytest.raises(TypeError):
        task(name="noctx", registry=registry)(lambda: None)


def test_prepare_many_names_the_failing_item() -> None:
    with pytest.raises(errors.InvalidPriorityError) as info:
        enq.prepare_many([{"task": "noop"}, {"task": "noop", "priority": 12}], limits=LIMITS)
    assert "item 1" in str(info.value)
    assert info.value.details["index"] == 1


def test_assign_ids_maps_mixed_keyed_and_unkeyed_rows() -> None:
    rows = enq.prepare_many(
        [
            {"task": "noop"},
            {"task": "noop", "dedup_key": "a"},
            {"task": "noop"},
            {"task": "noop", "dedup_key": "a"},
            {"task": "noop", "dedup_key": "b"},
        ],
        limits=LIMITS,
    )
    inserted = [(12, "default", None), (10, "default", None), (11, "default", "a")]
    assert enq._assign_ids(rows, inserted, {("default", "b"): 3}) == [10, 11, 12, 11, 3]


def test_prepare_many_checks_every_items_options_even_when_equal_to_an_earlier_ones() -> None:
    # priority=True equals 1 (and hashes alike): a cached check for 1 must not let it through
    with pytest.raises(errors.InvalidPriorityError) as info:
        enq.prepare_many([{"task": "noop", "priority": 1}, {"task": "noop", "priority": True}], limits=LIMITS)
    assert info.value.details["index"] == 1


def test_prepare_many_validates_each_items_args_and_keeps_their_order() -> None:
    rows = enq.prepare_many(
        [
            {"task": "send_welcome", "args": {"user_id": "1"}},
            {"task": tasks_core.send_welcome, "args": {"user_id": 2, "lang": "de"}, "headers": {"h": 1}},
            {"task": "send_welcome", "args": {"user_id": 3}, "headers": {"h": 2}},
            {"task": "core.sync_add", "args": {"a": 1, "b": 2}, "priority": 1},
        ],
        limits=LIMITS,
        queue="bulk",
    )
    assert [(r.task, r.args, r.headers, r.queue, r.priority) for r in rows] == [
        ("send_welcome", '{"user_id":1}', "{}", "bulk", 7),
        ("send_welcome", '{"user_id":2,"lang":"de"}', '{"h":1}', "bulk", 7),
        ("send_welcome", '{"user_id":3}', '{"h":2}', "bulk", 7),
        ("core.sync_add", '{"a":1,"b":2}', "{}", "bulk", 1),
    ]
    with pytest.raises(errors.InvalidArgsError) as info:
        enq.prepare_many([{"task": "send_welcome", "args": {"user_id": 1}}, {"task": "send_welcome"}], limits=LIMITS)
    assert info.value.details["index"] == 1
    assert str(info.value).startswith("item 1: invalid args for task 'send_welcome'")


def test_args_that_are_not_json_are_refused() -> None:
    registry = Registry()

    @task(name="anything", registry=registry)
    async def anything(ctx, value) -> None: ...  # type: ignore[no-untyped-def]

    with pytest.raises(errors.InvalidArgsError, match="not JSON-serialisable"):
        enq.prepare("anything", {"value": object()}, registry=registry, limits=LIMITS)
    row = enq.prepare("anything", {"value": {"nested": [1, 2.5, None, "é"]}}, registry=registry, limits=LIMITS)
    assert row.args == '{"value":{"nested":[1,2.5,null,"é"]}}'


def test_call_args_are_typed_with_defaults_and_nothing_else() -> None:
    spec = postbox.default_registry.get("send_welcome")
    assert spec.call_args({"user_id": "7"}) == {"user_id": 7, "lang": "en"}
    with pytest.raises(errors.InvalidArgsError):
        spec.call_args({"user_id": 7, "unexpected": 1})
    with pytest.raises(errors.InvalidArgsError):
        spec.call_args({})
