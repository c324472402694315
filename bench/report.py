"""The benchmark report: figures with their repetitions, and the printed table.

A :class:`Figure` is one measured quantity of one system (postbox or a peer)
with one value per repetition; the table shows its median, min and max, the
target it is held to, and, for peers, the postbox/peer ratio of the same
figure.  Where a peer's repetitions alternated with postbox's (``paired``:
repetition i of each ran back to back), the ratio is the median of the
per-repetition ratios, so a machine that drifts over minutes moves both sides
of each ratio alike; otherwise it is the ratio of the medians.  Rendering is
pure (strings in, strings out) so it is unit-tested.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from postbox_bench.stats import Spread

POSTBOX = "postbox"
FLOOR = "floor"  # the delivery contract's shortest path (postbox_bench.floor), reported as a system of its own
FLOOR_TASKS = "floor-tasks"  # the same with each job's handler in a task of its own (bench worker --floor)


@dataclass(frozen=True)
class Target:
    op: Literal[">=", "<="]
    value: float

    def met(self, measured: float) -> bool:
        return measured >= self.value if self.op == ">=" else measured <= self.value

    def __str__(self) -> str:
        return f"{self.op} {format_number(self.value)}"


@dataclass
class Figure:
    """One quantity, one system, one value per repetition."""

    scenario: str
    key: str  # stable id, e.g. "worker.noop_1p"; peers share postbox's key for ratios
    label: str
    unit: str
    values: list[float] = field(default_factory=list)
    system: str = POSTBOX
    target: Target | None = None
    higher_is_better: bool = True
    paired: bool = False  # a peer's repetition i ran right after postbox's repetition i

    @property
    def spread(self) -> Spread:
        return Spread.of(self.values)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scenario": self.scenario,
            "key": self.key,
            "label": self.label,
            "system": self.system,
            "unit": self.unit,
            "values": self.values,
            "higher_is_better": self.higher_is_better,
        }
        if self.values:
            out.update(self.spread.as_dict())
        if self.target is not None:
            out["target"] = str(self.target)
            out["target_met"] = bool(self.values) and self.target.met(self.spread.median)
        return out


@dataclass(frozen=True)
class Ratio:
    """postbox / peer for one figure: the median of paired ratios, or of the medians."""

    mine: Figure
    peer: Figure
    value: float
    low: float | None = None  # range of the per-repetition ratios (paired figures only)
    high: float | None = None

    @property
    def paired(self) -> bool:
        return self.low is not None

    @classmethod
    def of(cls, mine: Figure, peer: Figure) -> Ratio:
        if peer.paired and len(mine.values) == len(peer.values) and all(peer.values):
            each = [m / p for m, p in zip(mine.values, peer.values, strict=True)]
            spread = Spread.of(each)
            return cls(mine, peer, spread.median, spread.low, spread.high)
        denominator = peer.spread.median
        return cls(mine, peer, mine.spread.median / denominator if denominator else float("inf"))


@dataclass
class Report:
    machine: Mapping[str, Any]
    parameters: Mapping[str, Any]
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure

    def ratios(self) -> list[Ratio]:
        """postbox / peer for every peer figure that postbox also measured."""
        ours = {f.key: f for f in self.figures if f.system == POSTBOX and f.values}
        return [
            Ratio.of(ours[peer.key], peer)
            for peer in self.figures
            if peer.system != POSTBOX and peer.values and peer.key in ours
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "machine": dict(self.machine),
            "parameters": dict(self.parameters),
            "figures": [f.as_dict() for f in self.figures],
            "ratios": [
                {
                    "key": r.mine.key,
                    "peer": r.peer.system,
                    "postbox_over_peer": r.value,
                    "paired": r.paired,
                    **({"min": r.low, "max": r.high} if r.paired else {}),
                }
                for r in self.ratios()
            ],
            "notes": self.notes,
        }


def format_number(value: float) -> str:
    """Thousands separators for large figures, 2 decimals for small ones."""
    if value != value:  # NaN
        return "nan"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:,.1f}"
    return f"{value:,.2f}"


def format_ratio(value: float) -> str:
    """2 decimals, or 2 significant digits below 0.1 (a tiny latency ratio is not 0.00x)."""
    if value != value or value == float("inf"):
        return str(value)
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.2g}x"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    """Plain-text columns: text left-aligned, numbers right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
        return "  ".join(parts).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _kv(mapping: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in mapping.items())


def _ratio_range(ratio: Ratio | None) -> str:
    if ratio is None or ratio.low is None or ratio.high is None:
        return ""
    return f"{format_ratio(ratio.low)[:-1]}-{format_ratio(ratio.high)}"


def render(report: Report) -> str:
    """The text the command prints: machine, parameters, figures, peer ratios, notes."""
    lines = ["postbox bench", "", "machine:    " + _kv(report.machine), "parameters: " + _kv(report.parameters), ""]
    ours = [f for f in report.figures if f.system == POSTBOX]
    headers = ["scenario", "figure", "median", "min", "max", "unit", "runs", "target", "met"]
    right = [False, False, True, True, True, False, True, False, False]
    rows = []
    for fig in ours:
        if fig.values:
            s = fig.spread
            cells = [format_number(s.median), format_number(s.low), format_number(s.high)]
            runs = str(s.runs)
        else:
            cells, runs = ["-", "-", "-"], "0"
        target = str(fig.target) if fig.target else ""
        met = ""
        if fig.target is not None:
            met = ("yes" if fig.target.met(fig.spread.median) else "NO") if fig.values else "n/a"
        rows.append([fig.scenario, fig.label, *cells, fig.unit, runs, target, met])
    if rows:
        lines += render_table(headers, rows, right)
    peers = [f for f in report.figures if f.system != POSTBOX]
    if peers:
        ratios = {(r.peer.system, r.peer.key): r for r in report.ratios()}
        lines += [
            "",
            "peers (same workloads, same servers, same run; ratio = postbox / peer: where the repetitions",
            "alternated, the median of the per-repetition ratios, with their range; else of the medians):",
            "",
        ]
        headers = ["figure", "system", "median", "min", "max", "unit", "postbox", "ratio", "range", "better"]
        right = [False, False, True, True, True, False, True, True, True, False]
        ours_by_key = {f.key: f for f in ours if f.values}
        prows = []
        for fig in peers:
            if not fig.values:
                prows.append([fig.label, fig.system, "-", "-", "-", fig.unit, "", "", "", ""])
                continue
            s = fig.spread
            mine = ours_by_key.get(fig.key)
            ratio = ratios.get((fig.system, fig.key))
            prows.append(
                [
                    fig.label,
                    fig.system,
                    format_number(s.median),
                    format_number(s.low),
                    format_number(s.high),
                    fig.unit,
                    format_number(mine.spread.median) if mine else "",
                    format_ratio(ratio.value) if ratio is not None else "",
                    _ratio_range(ratio),
                    "higher" if fig.higher_is_better else "lower",
                ]
            )
        lines += render_table(headers, prows, right)
    if report.notes:
        lines += ["", "notes:"] + [f"  - {note}" for note in report.notes]
    return "\n".join(lines) + "\n"
