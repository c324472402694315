"""dtq: demo tasks for trying postbox without writing code (``--tasks postbox_examples.dtq``).

See :mod:`postbox_examples.dtq.tasks`; the counter's table is created by
``stagedoor migrate`` (:func:`postbox_examples.dtq.schema.migrate`).
"""

from postbox_examples.dtq.tasks import always_fail, counter, echo, fibonacci, flaky, sleep, slow

__all__ = ["always_fail", "counter", "echo", "fibonacci", "flaky", "sleep", "slow"]
