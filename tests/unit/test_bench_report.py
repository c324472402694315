"""The bench report: targets, peer ratios, the printed table and JSON (pure)."""

from __future__ import annotations

import json

from postbox_bench.report import Figure, Ratio, Report, Target, format_number, format_ratio, render, render_table


def sample_report() -> Report:
    report = Report(
        machine={"cores": 2, "postgresql": "15.20", "redis": "7.0.15"},
        parameters={"jobs": 20000, "repeat": 3},
    )
    report.add(
        Figure(
            "worker",
            "worker.noop_1p",
            "no-op jobs/s, 1 process",
            "jobs/s",
            [5000, 6000, 5500],
            target=Target(">=", 4000),
        )
    )
    report.add(
        Figure(
            "latency",
            "latency.p50@200",
            "p50 @ 200/s",
            "ms",
            [6.0, 4.0, 5.5],
            target=Target("<=", 5),
            higher_is_better=False,
        )
    )
    report.add(
        Figure("worker", "worker.noop_1p", "no-op jobs/s, 1 process", "jobs/s", [2000, 2200, 2750], system="pgqueuer")
    )
    report.add(Figure("latency", "latency.p50@200", "p50 @ 200/s", "ms", [11.0], system="arq", higher_is_better=False))
    return report


def test_target_met() -> None:
    assert Target(">=", 0.8).met(0.8)
    assert not Target(">=", 0.8).met(0.79)
    assert Target("<=", 5).met(5)
    assert not Target("<=", 5).met(5.01)
    assert str(Target(">=", 50_000)) == ">= 50,000"


def test_format_number() -> None:
    assert format_number(123456.7) == "123,457"
    assert format_number(12.34) == "12.3"
    assert format_number(0.816) == "0.82"
    assert format_number(float("nan")) == "nan"


def test_ratios_are_postbox_median_over_peer_median() -> None:
    ratios = {(r.peer.system, r.peer.key): r.value for r in sample_report().ratios()}
    assert ratios == {("pgqueuer", "worker.noop_1p"): 2.5, ("arq", "latency.p50@200"): 0.5}
    assert not any(r.paired for r in sample_report().ratios())


def test_a_paired_ratio_is_the_median_of_the_per_repetition_ratios() -> None:
    mine = Figure("worker", "worker.noop_1p", "jobs/s", "jobs/s", [10_000, 13_000, 12_000])
    # The machine slowed down during rep 1 and sped up in rep 2: both systems moved alike.
    peer = Figure("worker", "worker.noop_1p", "jobs/s", "jobs/s", [8_000, 8_125, 7_500], system="p", paired=True)
    ratio = Ratio.of(mine, peer)
    assert (ratio.value, ratio.low, ratio.high) == (1.6, 1.25, 1.6)
    assert ratio.paired
    # Ratio of medians for the same numbers: 12,000 / 8,000.
    unpaired = Ratio.of(mine, Figure("worker", "worker.noop_1p", "jobs/s", "jobs/s", peer.values, system="p"))
    assert (unpaired.value, unpaired.paired) == (1.5, False)


def test_a_paired_figure_with_missing_repetitions_falls_back_to_the_medians() -> None:
    mine = Figure("worker", "k", "jobs/s", "jobs/s", [10_000, 13_000, 12_000])
    peer = Figure("worker", "k", "jobs/s", "jobs/s", [8_000, 6_000], system="p", paired=True)
    ratio = Ratio.of(mine, peer)
    assert (ratio.value, ratio.paired) == (12_000 / 7_000, False)


def test_format_ratio_keeps_small_ratios_readable() -> None:
    assert format_ratio(1.6) == "1.60x"
    assert format_ratio(0.1) == "0.10x"
    assert format_ratio(0.0042) == "0.0042x"
    assert format_ratio(float("inf")) == "inf"


def test_render_shows_the_range_of_paired_ratios() -> None:
    report = Report(machine={}, parameters={})
    report.add(Figure("worker", "worker.noop_1p", "no-op", "jobs/s", [10_000, 13_000, 12_000]))
    report.add(Figure("worker", "worker.noop_1p", "no-op", "jobs/s", [8_000, 8_125, 7_500], system="p", paired=True))
    row = next(line for line in render(report).splitlines() if line.startswith("no-op") and " p " in line)
    assert row.split()[-3:] == ["1.60x", "1.25-1.60x", "higher"]


def test_render_shows_machine_medians_targets_and_ratios() -> None:
    text = render(sample_report())
    lines = text.splitlines()
    assert lines[0] == "postbox bench"
    assert "machine:    cores=2, postgresql=15.20, redis=7.0.15" in lines
    assert "parameters: jobs=20000, repeat=3" in lines
    row = next(line for line in lines if line.startswith("worker ") and "no-op" in line)
    assert "5,500" in row and "5,000" in row and "6,000" in row and ">= 4,000" in row and row.endswith("yes")
    lat = next(line for line in lines if line.startswith("latency "))
    assert "5.50" in lat and "<= 5.00" in lat and lat.endswith("NO")
    peer = next(line for line in lines if "pgqueuer" in line)
    assert "2,200" in peer and "2.50x" in peer and peer.endswith("higher")
    arq = next(line for line in lines if " arq " in line)
    assert "0.50x" in arq and arq.endswith("lower")


def test_render_marks_a_figure_without_values() -> None:
    report = Report(machine={}, parameters={})
    report.add(Figure("relay", "relay.rows", "rows/s", "rows/s", [], target=Target(">=", 30000)))
    report.notes.append("relay: failed: boom")
    text = render(report)
    row = next(line for line in text.splitlines() if line.startswith("relay"))
    assert row.split()[-1] == "n/a" and " - " in row
    assert text.endswith("notes:\n  - relay: failed: boom\n")


def test_json_carries_every_figure_and_ratio() -> None:
    data = json.loads(json.dumps(sample_report().as_dict()))
    assert [f["system"] for f in data["figures"]] == ["postbox", "postbox", "pgqueuer", "arq"]
    first = data["figures"][0]
    assert (first["median"], first["min"], first["max"], first["runs"]) == (5500, 5000, 6000, 3)
    assert first["target"] == ">= 4,000" and first["target_met"] is True
    assert data["figures"][1]["target_met"] is False
    assert data["ratios"] == [
        {"key": "worker.noop_1p", "peer": "pgqueuer", "postbox_over_peer": 2.5, "paired": False},
        {"key": "latency.p50@200", "peer": "arq", "postbox_over_peer": 0.5, "paired": False},
    ]


def test_render_table_aligns_columns() -> None:
    lines = render_table(["a", "num"], [["x", "1"], ["long", "1,000"]], [False, True])
    assert lines == ["a       num", "----  -----", "x         1", "long  1,000"]
