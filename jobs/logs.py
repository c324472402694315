"""Structured logging for every postbox process.

``setup(json=..., level=...)`` once at process start. Fields passed through
``extra`` (outbox_id, task, queue, attempt, worker_id...) are kept; in text
mode they follow the message as ``key=value``; in JSON mode they are keys.
Newlines in values are escaped so one record is one line, and text no encoder
accepts (lone surrogates, NULs) is made safe (:mod:`postbox.text`), so a record
is never lost to a handler's odd string. Never log payloads
or secrets: log the outbox id and let operators look the job up.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from postbox.text import safe_text

FIELDS = ("outbox_id", "task", "queue", "attempt", "worker_id", "relay_id", "role", "count", "request_id")
_STANDARD = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return safe_text(value).replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return value


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: _clean(v) for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname:<7} {record.name}: {_clean(record.getMessage())}"
        if extras:
            line += " " + extras
        if record.exc_info:
            line += " | " + _clean(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": safe_text(record.getMessage()),
        }
        data.update(_extras(record))
        if record.exc_info:
            data["exc"] = safe_text(self.formatException(record.exc_info))
        try:
            return orjson.dumps(data, default=lambda v: safe_text(str(v))).decode()
        except TypeError:  # a non-str text deep in an extra value: keep the record, lose its detail
            return orjson.dumps({k: safe_text(str(v)) for k, v in data.items()}).decode()


def setup(*, json: bool = False, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
