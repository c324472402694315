"""Text every store and log accepts (postbox.text), and its users."""

from __future__ import annotations

import logging

import orjson

from postbox.logs import JsonFormatter, TextFormatter
from postbox.outcomes import Backoff, encode_result, failed
from postbox.text import safe_text, safe_value

BAD = b"report-\xff.pdf".decode("utf-8", "surrogateescape")


def test_safe_text_escapes_lone_surrogates_and_drops_nul() -> None:
    assert safe_text(BAD) == "report-\\udcff.pdf"
    assert safe_text("a\x00b") == "ab"
    assert safe_text("café ✓") == "café ✓"
    assert safe_value({BAD: [BAD, 2**70, 1.5, None, ("x",)], 3: object}) == {
        "report-\\udcff.pdf": ["report-\\udcff.pdf", str(2**70), 1.5, None, ["x"]],
        "3": "<class 'object'>",
    }


def test_results_are_always_jsonb_text() -> None:
    assert encode_result({"a": 1}) == '{"a":1}'
    assert orjson.loads(encode_result({"n": BAD, "z": "a\x00b"})) == {"n": "report-\\udcff.pdf", "z": "ab"}
    assert orjson.loads(encode_result(2**80)) == str(2**80)


def test_a_failure_with_unencodable_text_becomes_a_safe_outcome() -> None:
    out = failed(FileNotFoundError(BAD), attempt=3, max_attempts=3, backoff=Backoff(1, 1, 0), rand=lambda: 0.5)
    assert (out.state, out.error) == ("dead", "attempts exhausted (3/3): report-\\udcff.pdf")
    assert out.result is not None and "udcff" in out.result


def test_log_records_with_unencodable_text_are_written() -> None:
    record = logging.makeLogRecord({"msg": "run failed: %s", "args": (BAD,), "levelname": "INFO", "task": BAD})
    assert orjson.loads(JsonFormatter().format(record))["task"] == "report-\\\\udcff.pdf"  # extras: escaped
    assert orjson.loads(JsonFormatter().format(record))["msg"] == "run failed: report-\\udcff.pdf"
    assert TextFormatter().format(record).encode("utf-8").endswith(b"task=report-\\\\udcff.pdf")
