"""Peers run through the same workloads: PgQueuer, Procrastinate, arq, SAQ (not written yet)."""

from __future__ import annotations

from collections.abc import Sequence

from app.bench.params import Params
from app.bench.progress import Progress
from app.bench.report import Report
from app.bench.sandbox import Sandbox


def run_peers(box: Sandbox, scenarios: Sequence[str], params: Params, progress: Progress, report: Report) -> None:
    report.notes.append("peers: not written yet")
