"""``stagedoor``: the example's commands (the demo, its migration and API, the mail provider).

Kept apart from ``postbox``, whose commands are an operator's only.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("postbox_examples.demo:main", "the Stagedoor demo, end to end (embedded servers when no URLs are set)"),
    "migrate": ("postbox_examples.stagedoor.cli:migrate_main", "postbox's schema, then the example's own tables"),
    "api": ("postbox_examples.stagedoor.cli:api_main", "api run: postbox's API plus the example's order routes"),
    "provider": ("postbox_examples.provider.cli:main", "provider run: the example mail provider (HTTP)"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: stagedoor <command> [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"stagedoor: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, _, func_name = COMMANDS[name][0].partition(":")
    func: Callable[[Sequence[str]], int] = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
