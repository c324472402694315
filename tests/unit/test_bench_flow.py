"""The arithmetic of `bench flow` (bench/flow.py): achieved and peak rates, pauses."""

from __future__ import annotations

import math

import pytest

from postbox_bench import cli, flow
from postbox_bench.params import Params


def test_achieved_rate_counts_intervals_from_the_first_start_to_the_last() -> None:
    assert flow.achieved_rate([10.0, 10.5, 11.0]) == pytest.approx(2.0)
    assert math.isnan(flow.achieved_rate([10.0]))
    assert math.isnan(flow.achieved_rate([10.0, 10.0]))


def test_peak_rate_is_the_fastest_run_of_consecutive_starts() -> None:
    # Evenly 10/s, then 3 starts 50 ms apart: the fastest 2 intervals are 0.1 s.
    times = [0.0, 0.1, 0.2, 0.3, 0.35, 0.4]
    assert flow.peak_rate(times, 2) == pytest.approx(20.0)
    assert flow.peak_rate(times, 100) == pytest.approx(5 / 0.4)  # a window past the run: the whole run
    assert math.isnan(flow.peak_rate([1.0], 5))


def test_longest_gap_between_consecutive_starts_in_any_order() -> None:
    assert flow.longest_gap([3.0, 0.0, 1.0]) == pytest.approx(2.0)
    assert math.isnan(flow.longest_gap([1.0]))


def test_the_overhead_configurations_limit_something_else_than_the_drained_task() -> None:
    assert {name for _, name, _ in flow.ELSEWHERE} == {"bench_limited", flow.SIDE_QUEUE}
    assert "bench_noop" not in {name for _, name, _ in flow.ELSEWHERE}
    argv = flow.overhead_argv(7)
    assert argv[argv.index("--queues") + 1] == f"bench,{flow.SIDE_QUEUE}"
    assert argv[argv.index("--concurrency") + 1] == "7"


def test_configuration_b_as_a_worker_holds_it_limits_others_only() -> None:
    limits = flow.elsewhere_limits()
    assert limits
    assert limits.limited("bench", "bench_limited") and limits.limited(flow.SIDE_QUEUE, "bench_noop")
    assert not limits.limited("bench", "bench_noop")
    assert flow.decision_ns(1, rounds=100) > 0 and flow.decision_ns(50, rounds=100) > 0


def test_flow_rate_comes_from_the_params() -> None:
    assert flow.flow_rate(Params()) == flow.DEFAULT_RATE
    assert flow.flow_rate(Params(extra={"flow_rate": 40})) == 40
    with pytest.raises(ValueError, match="flow rate"):
        flow.flow_rate(Params(extra={"flow_rate": 0}))


def test_the_cli_knows_flow_outside_all_and_its_rate_option() -> None:
    assert "flow" in cli.EXTRA_SCENARIOS and "flow" not in cli.SCENARIOS
    args = cli.parser().parse_args(["flow", "--flow-rate", "30"])
    assert (args.scenario, args.flow_rate) == ("flow", 30)
    assert cli.parser().parse_args(["flow"]).flow_rate == flow.DEFAULT_RATE
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["flow", "--flow-rate", "0"])
