"""``postbox limits list|show|set|clear``: flow-control limits, and overrides applied without a restart."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from postbox import flow
from postbox.app.admin.common import EXIT_OK, Parser, Session, cli_actor, details, run, table, to_json
from postbox.app.services import limits as limit_service
from postbox.app.services.results import as_dict
from postbox.errors import InvalidOptionError

COLUMNS = ("scope", "name", "queue", "declared", "override", "effective", "in_use", "held")
NONE = "none"
UNSET: Any = object()  # an option not given (``none`` is a value: it lifts that limit)


def limit_text(limit: Mapping[str, Any] | None) -> str:
    """A declared or effective limit as the API shows it (``flow.describe``), as text."""
    if limit is None:
        return NONE
    return flow.describe_text(flow.FlowLimit.from_json(limit))


def override_text(override: Mapping[str, Any] | None) -> str:
    """``concurrency 1, rate none``: each key of the override (``none`` lifts that limit)."""
    if not override:
        return "-"
    parts = []
    if "concurrency" in override:
        parts.append(f"concurrency {override['concurrency'] if override['concurrency'] is not None else NONE}")
    if "rate" in override:
        rate = override["rate"]
        try:
            shown = NONE if rate is None else str(flow.Rate.parse(rate))
        except Exception:
            shown = str(rate)
        parts.append(f"rate {shown}")
    return ", ".join(parts)


def row(item: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "scope": item["scope"],
        "name": item["name"],
        "queue": item["queue"],
        "declared": limit_text(item["declared"]),
        "override": override_text(item["override"]),
        "effective": item["effective_text"],
        "in_use": item["in_use"],
        "held": item["held"],
    }


def concurrency_arg(text: str) -> int | None:
    if text.strip().lower() == NONE:
        return None
    try:
        if len(text) > 20:  # int() refuses past 4,300 digits; no limit has more than 7
            raise ValueError(text)
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid concurrency {text[:40]!r}: an integer 1-{flow.MAX_LIMIT} or 'none'"
        ) from None
    try:
        return flow.check_concurrency(number)
    except InvalidOptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rate_arg(text: str) -> Any:
    """``50/s``, ``10/m``, ``5/10s``, ``none``, or a JSON object ``{"limit": 5, "period": 1, "burst": 3}``."""
    if text.strip().lower() == NONE:
        return None
    value: Any = text
    if text.lstrip().startswith("{"):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise argparse.ArgumentTypeError(f"invalid rate {text[:40]!r}: not valid JSON") from None
    try:
        flow.Rate.parse(value)  # the one parser the API and @task use: refused here, exit 2
    except InvalidOptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def parser() -> Parser:
    p = Parser(prog="postbox limits", description="Flow-control limits: declared, overridden, in force, in use.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    lst = sub.add_parser("list", help="every queue and task with limits, slots in use and jobs held back")
    show = sub.add_parser("show", help="one queue's or task's limits")
    set_ = sub.add_parser("set", help="override limits (merged into the current override; applied within seconds)")
    clear = sub.add_parser("clear", help="lift an override (or one field): the declared limits are in force again")
    for each in (show, set_, clear):
        each.add_argument("scope", help="queue or task")
        each.add_argument("name", help="the queue's or the task's name")
    set_.add_argument(
        "--concurrency", type=concurrency_arg, default=UNSET, help="jobs at once across all workers, or 'none'"
    )
    set_.add_argument(
        "--rate", type=rate_arg, default=UNSET, help="50/s, 10/m, 100/h, 5/10s, JSON {limit, period, burst}, or 'none'"
    )
    clear.add_argument("--field", choices=flow.OVERRIDABLE, help="lift only this field of the override")
    for each in (lst, show, set_, clear):
        each.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _print(item: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(to_json(item))
        return
    shown = dict(item)
    shown["declared"] = limit_text(item["declared"])
    shown["override"] = override_text(item["override"])
    shown["effective"] = item["effective_text"]
    details(shown, sys.stdout, skip=("effective_text",))


async def cmd_list(s: Session, a: argparse.Namespace) -> int:
    found = [as_dict(item) for item in await limit_service.list_limits(s.conn)]
    if a.json:
        print(to_json(found))
    else:
        table([row(item) for item in found], COLUMNS, sys.stdout)
    return EXIT_OK


async def cmd_show(s: Session, a: argparse.Namespace) -> int:
    _print(as_dict(await limit_service.get_limit(s.conn, a.scope, a.name)), a.json)
    return EXIT_OK


async def cmd_set(s: Session, a: argparse.Namespace) -> int:
    values = {name: getattr(a, name) for name in flow.OVERRIDABLE if getattr(a, name) is not UNSET}
    item = as_dict(await limit_service.set_override(s.conn, a.scope, a.name, values, cli_actor()))
    if a.json:
        print(to_json(item))
    else:
        print(f"{a.scope} {a.name}: override {override_text(item['override'])}; in force: {item['effective_text']}")
    return EXIT_OK


async def cmd_clear(s: Session, a: argparse.Namespace) -> int:
    item = as_dict(await limit_service.clear_override(s.conn, a.scope, a.name, cli_actor(), field=a.field))
    if a.json:
        print(to_json(item))
    else:
        what = f"override of {a.field}" if a.field else "override"
        print(f"{a.scope} {a.name}: {what} cleared; in force: {item['effective_text']}")
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    return run(
        "postbox limits",
        parser(),
        argv,
        {"list": cmd_list, "show": cmd_show, "set": cmd_set, "clear": cmd_clear},
    )
