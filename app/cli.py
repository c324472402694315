"""``postbox``: one command, one subcommand per process or tool.

Each subcommand lives in its own module and is imported only when called, so
``postbox relay run`` never loads FastAPI and ``postbox --help`` loads nothing.
This is an entry point: it is the one place allowed to import app, relay and
worker side by side.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

# subcommand -> ("module:function", one-line help). The function takes argv (the
# words after the subcommand) and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "migrate": ("postbox.app.migrate_cli:main", "upgrade the database to the latest schema (alembic head)"),
    "relay": ("postbox.relay.cli:main", "relay run: publish committed jobs from the outbox to Redis"),
    "worker": ("postbox.worker.cli:main", "worker run: consume jobs and run their handlers"),
    "api": ("postbox.app.api_cli:main", "api run: the REST API, /metrics and the web dashboard at /"),
    "jobs": ("postbox.app.admin.jobs_cli:main", "jobs get|list|cancel|enqueue|move"),
    "dlq": ("postbox.app.admin.dlq_cli:main", "dlq list|show|requeue|discard|purge"),
    "queues": ("postbox.app.admin.queues_cli:main", "queues list|pause|resume|fair|unfair|fairness"),
    "workers": ("postbox.app.admin.workers_cli:main", "workers list"),
    "schedules": ("postbox.app.admin.schedules_cli:main", "schedules list|pause|resume|trigger"),
    "sessions": ("postbox.app.admin.sessions_cli:main", "sessions list|revoke: the dashboard's login sessions"),
    "workflows": ("postbox.app.admin.workflows_cli:main", "workflows list|get|cancel|retry: chains, groups, fan-ins"),
    "encryption": ("postbox.app.admin.encryption_cli:main", "encryption new-key|reencrypt: encrypted tasks' keys"),
    "limits": ("postbox.app.admin.limits_cli:main", "limits list|show|set|clear: flow-control limits and overrides"),
    "prune": ("postbox.app.prune_cli:main", "delete finished jobs past their retention"),
}


def usage() -> str:
    lines = ["usage: postbox <command> [options]", "", "commands:"]
    width = max(len(name) for name in COMMANDS)
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run `postbox <command> --help` for a command's options."]
    return "\n".join(lines)


def resolve(name: str) -> Callable[[Sequence[str]], int]:
    target, _ = COMMANDS[name]
    module_name, _, func_name = target.partition(":")
    module = importlib.import_module(module_name)
    func: Callable[[Sequence[str]], int] = getattr(module, func_name)
    return func


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"postbox: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return int(resolve(name)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
