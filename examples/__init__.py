"""postbox's examples: not part of the ``postbox`` package a user installs.

- :mod:`postbox_examples.stagedoor`: Stagedoor, the ticket shop (its tasks, routes and tables);
- :mod:`postbox_examples.provider`: the mail provider Stagedoor sends through;
- :mod:`postbox_examples.dtq`: demo tasks for trying postbox without writing code;
- :mod:`postbox_examples.demo`: the demo runner (``make demo``);
- :mod:`postbox_examples.embedded`: embedded PostgreSQL and a Redis-compatible server
  for a machine that has neither (``make demo`` and ``make test``).

Installed into the development environment by ``make demo`` / ``make test``
from ``examples/pyproject.toml``; the command is ``stagedoor``.
"""
