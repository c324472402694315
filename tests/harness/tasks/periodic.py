"""Tasks with schedules, for the periodic-job system tests (imported by relay and worker processes).

``POSTBOX_TEST_SCHEDULES=v2`` is the next version of this code: the schedule
``doomed`` is no longer declared.
"""

from __future__ import annotations

import os

from postbox import periodic, task


@task(queue="ticks")
async def tick(ctx, label: str = "") -> None:  # type: ignore[no-untyped-def]
    return None


periodic(tick, every=1, args={"label": "second"}, name="every-second")
if os.environ.get("POSTBOX_TEST_SCHEDULES", "v1") == "v1":
    periodic(tick, every=1, args={"label": "doomed"}, name="doomed")
