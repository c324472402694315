"""The jobs a notification's payload carries (migration 0018), as the relay's select returns rows."""

from __future__ import annotations

import orjson

from postbox.relay.notifier import notified_rows

ROW = [7, "default", "noop", '{"n": 1}', "{}", 5, 0, 1_700_000_000_000, False]


def payload(*items: object) -> str:
    return orjson.dumps(list(items)).decode()


def test_a_payload_of_this_schema_is_a_row_as_the_select_returns_it() -> None:
    assert notified_rows([payload("postbox", *ROW)], "postbox") == [tuple(ROW)]
    assert notified_rows([payload("shop", *ROW)], "shop") == [tuple(ROW)]


def test_anything_else_is_dropped() -> None:
    dropped = [
        "",
        "not json",
        "{}",
        payload("other", *ROW),  # another schema's relay publishes it
        payload("postbox", *ROW[:-1]),  # a field short
        payload("postbox", "7", *ROW[1:]),  # an id that is not a number
        payload("postbox", True, *ROW[1:]),  # nor a boolean
        payload("postbox", *ROW[:3], {"n": 1}, *ROW[4:]),  # arguments not as text
        payload("postbox", *ROW[:-1], 0),  # expired not a boolean
    ]
    assert notified_rows(dropped, "postbox") == []
    assert notified_rows([*dropped, payload("postbox", *ROW)], "postbox") == [tuple(ROW)]
