"""Inputs that used to be accepted silently and altered: each is refused with a typed error naming the problem."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from psycopg import AsyncConnection, Connection
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from postbox import errors
from postbox import producer as enq
from postbox.registry import Registry, task

LIMITS = enq.Limits(max_payload_bytes=4096)
URL = "postgresql+psycopg://nobody@127.0.0.1:1/none"  # never connected: the refusals come first


@pytest.fixture
def registry() -> Registry:
    reg = Registry()

    @task(name="pay", registry=reg)
    def pay(ctx: Any, amount: int, when: datetime | None = None, note: Any = None) -> None: ...

    @task(name="pay_exact", registry=reg)
    def pay_exact(ctx: Any, amount: Decimal, parts: list[Decimal] | None = None) -> None: ...

    return reg


def prep(registry: Registry, name: str, args: dict[str, Any]) -> enq.JobRow:
    return enq.prepare(name, args, registry=registry, limits=LIMITS)


# --- partition_by names an argument --------------------------------------------------------


def test_partition_by_that_names_no_argument_is_refused_at_declaration() -> None:
    reg = Registry()
    with pytest.raises(errors.InvalidOptionError, match="partition_by='nope' is not an argument") as caught:

        @task(concurrency=1, partition_by="nope", registry=reg)
        def send(ctx: Any, customer_id: int) -> None: ...

    assert caught.value.field == "partition_by"
    assert "customer_id" in str(caught.value)
    assert "send" not in reg


def test_partition_by_an_argument_or_into_kwargs_is_accepted() -> None:
    reg = Registry()

    @task(concurrency=1, partition_by="customer_id", registry=reg)
    def send(ctx: Any, customer_id: int) -> None: ...

    @task(rate="5/s", partition_by="tenant", registry=reg)
    def loose(ctx: Any, **kwargs: Any) -> None: ...

    assert send.spec.limit.partition_by == "customer_id"
    assert loose.spec.limit.partition_by == "tenant"


def test_partition_by_without_a_limit_is_an_invalid_option() -> None:
    with pytest.raises(errors.InvalidOptionError, match="needs a concurrency or a rate") as caught:

        @task(partition_by="customer_id", registry=Registry())
        def send(ctx: Any, customer_id: int) -> None: ...

    assert caught.value.field == "partition_by"


# --- Decimal and naive datetimes ------------------------------------------------------------


def test_decimal_for_an_int_argument_is_refused_naming_the_argument(registry: Registry) -> None:
    with pytest.raises(errors.InvalidArgsError, match=r"args.amount: Decimal\('3'\)") as caught:
        prep(registry, "pay", {"amount": Decimal("3")})
    assert caught.value.field == "args.amount"


def test_decimal_nested_in_an_untyped_argument_is_refused(registry: Registry) -> None:
    with pytest.raises(errors.InvalidArgsError) as caught:
        prep(registry, "pay", {"amount": 1, "note": {"lines": [1, Decimal("2.50")]}})
    assert caught.value.field == "args.note.lines.1"


def test_decimal_for_a_decimal_argument_stays_exact(registry: Registry) -> None:
    row = prep(registry, "pay_exact", {"amount": Decimal("3.10"), "parts": [Decimal("1.05")]})
    assert row.args == '{"amount":"3.10","parts":["1.05"]}'


def test_naive_datetime_is_refused_and_an_aware_one_kept(registry: Registry) -> None:
    with pytest.raises(errors.InvalidArgsError, match=r"args\.when: naive datetime 2026-03-01T12:00:00") as caught:
        prep(registry, "pay", {"amount": 1, "when": datetime(2026, 3, 1, 12, 0)})
    assert caught.value.field == "args.when"
    row = prep(registry, "pay", {"amount": 1, "when": datetime(2026, 3, 1, 12, 0, tzinfo=UTC)})
    assert row.args == '{"amount":1,"when":"2026-03-01T12:00:00Z"}'


def test_bulk_enqueue_refuses_them_too_with_the_item_index(registry: Registry) -> None:
    items = [{"task": "pay", "args": {"amount": 1}}, {"task": "pay", "args": {"amount": Decimal("3")}}]
    with pytest.raises(errors.InvalidArgsError, match=r"item 1: args\.amount") as caught:
        enq.prepare_many(items, registry=registry, limits=LIMITS)
    assert caught.value.details["index"] == 1


# --- the sync/async mix-up names the right function -----------------------------------------


def test_async_targets_given_to_enqueue_name_enqueue_async(registry: Registry) -> None:
    engine = create_async_engine(URL)
    for target in (AsyncSession(engine), AsyncConnection.__new__(AsyncConnection)):
        with pytest.raises(errors.UnsupportedConnectionError, match=r"await enqueue_async\(\)"):
            enq.enqueue(target, "pay", {"amount": 1}, registry=registry)  # type: ignore[arg-type]


async def test_sync_targets_given_to_enqueue_async_name_enqueue(registry: Registry) -> None:
    engine = create_engine(URL)
    for target in (Session(engine), Connection.__new__(Connection)):
        with pytest.raises(errors.UnsupportedConnectionError, match=r"call enqueue\(\) on it"):
            await enq.enqueue_async(target, "pay", {"amount": 1}, registry=registry)  # type: ignore[arg-type]
