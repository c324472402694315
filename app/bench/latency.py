"""``bench latency``: not written yet (waits for the relay and worker components)."""

from __future__ import annotations

from app.bench.params import Params
from app.bench.progress import Progress
from app.bench.report import Figure
from app.bench.sandbox import Sandbox


def run(box: Sandbox, database_url: str, params: Params, progress: Progress) -> list[Figure]:
    raise NotImplementedError("the latency scenario is not written yet")
