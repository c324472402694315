"""One validation of numbers in args at every entry point: REST, enqueue, enqueue_many (sync and async).

An integer outside the signed 64-bit range, NaN and the infinities are refused
before anything is written: they would be stored altered (NaN as null) or
refused by the worker, sending the job straight to the dead letters.
"""

from __future__ import annotations

import math
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

import postbox
from postbox import task
from postbox.errors import ArgsOutOfRangeError, InvalidArgsError
from tests.harness.api import client_fixture  # noqa: F401


@task(queue="rangeq")
async def range_any(ctx, **kwargs: Any) -> None:  # type: ignore[no-untyped-def]
    """Takes anything: only the range check stands between these args and the outbox."""


@task(queue="rangeq")
async def range_float(ctx, x: float = 0.0) -> None:  # type: ignore[no-untyped-def]
    pass


OUT_OF_RANGE = [2**63, -(2**63) - 1, 1180591620717411303424, math.nan, math.inf, -math.inf]
EDGES = [2**63 - 1, -(2**63), 0, 1.5e308]


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM postbox.outbox").fetchone()
    conn.commit()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("value", OUT_OF_RANGE, ids=str)
def test_python_enqueue_refuses_with_a_typed_error(conn: psycopg.Connection[Any], value: Any) -> None:
    for args in ({"n": value}, {"a": "x", "nested": [{"v": value}]}):
        with pytest.raises(ArgsOutOfRangeError) as caught:
            postbox.enqueue(conn, range_any, args)
        assert isinstance(caught.value, InvalidArgsError)
        assert caught.value.code == "ARGS_OUT_OF_RANGE"
    with pytest.raises(ArgsOutOfRangeError) as many:
        postbox.enqueue_many(
            conn, [{"task": "range_any", "args": {"a": 1}}, {"task": "range_any", "args": {"a": value}}]
        )
    assert many.value.details["index"] == 1
    conn.rollback()
    assert _count(conn) == 0


def test_a_coerced_non_finite_float_is_refused_too(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(ArgsOutOfRangeError):
        postbox.enqueue(conn, range_float, {"x": "nan"})  # pydantic makes a NaN of the string
    conn.rollback()


async def test_async_enqueue_refuses(aconn: psycopg.AsyncConnection[Any]) -> None:
    with pytest.raises(ArgsOutOfRangeError):
        await postbox.enqueue_async(aconn, range_any, {"n": 2**64})
    with pytest.raises(ArgsOutOfRangeError):
        await postbox.enqueue_many_async(aconn, [{"task": "range_any", "args": {"n": -math.inf}}])


@pytest.mark.parametrize("value", EDGES, ids=str)
def test_the_edges_of_the_range_are_accepted_and_kept_exactly(conn: psycopg.Connection[Any], value: Any) -> None:
    job_id = postbox.enqueue(conn, range_any, {"n": value})
    conn.commit()
    row = conn.execute("SELECT args->'n' FROM postbox.outbox WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    assert (float(row[0]) if isinstance(value, float) else row[0]) == value  # jsonb prints 1.5e308 in full


@pytest.mark.parametrize(
    "literal",
    [b"9223372036854775808", b"-9223372036854775809", b"1180591620717411303424", b"NaN", b"Infinity", b"-1e999"],
)
def test_rest_refuses_with_422(client: TestClient, conn: psycopg.Connection[Any], literal: bytes) -> None:
    body = b'{"task": "api_sum", "args": {"a": 1, "b": ' + literal + b"}}"
    r = client.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] in ("ARGS_OUT_OF_RANGE", "VALIDATION_ERROR")
    if literal[-1:].isdigit() and b"e" not in literal:
        assert r.json()["error"]["code"] == "ARGS_OUT_OF_RANGE"
        assert r.json()["error"]["details"]["field"] == "args.b"
    assert _count(conn) == 0


def test_rest_accepts_the_largest_integer_exactly(client: TestClient) -> None:
    body = b'{"task": "api_sum", "args": {"a": 9223372036854775807, "b": -9223372036854775808}}'
    r = client.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    assert r.json()["args"] == {"a": 2**63 - 1, "b": -(2**63)}


@pytest.mark.parametrize(
    "args",
    ['{"n": 9223372036854775808}', '{"a": {"b": [1, -9223372036854775809]}}', '{"x": 1.5e300}'],
)
def test_the_sql_function_refuses_what_the_worker_would(conn: psycopg.Connection[Any], args: str) -> None:
    with pytest.raises(psycopg.errors.NumericValueOutOfRange, match="outside the signed 64-bit range"):
        conn.execute("SELECT postbox.enqueue('range_any', %s::jsonb)", (args,))
    conn.rollback()
    edge = '{"n": 9223372036854775807, "m": [-9223372036854775808, 1.5]}'
    job = conn.execute("SELECT postbox.enqueue('range_any', %s::jsonb)", (edge,)).fetchone()[0]  # type: ignore[index]
    assert conn.execute("SELECT args FROM postbox.outbox WHERE id = %s", (job,)).fetchone() == (
        {"n": 9223372036854775807, "m": [-9223372036854775808, 1.5]},
    )
