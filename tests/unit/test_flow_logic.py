"""Flow control's logic: limits, keys, overrides and the allocation of a batch (no I/O)."""

from __future__ import annotations

import pytest

from postbox.errors import InvalidOptionError
from postbox.flow import (
    Candidate,
    FlowLimit,
    JobKeys,
    Limits,
    Park,
    Rate,
    Reserve,
    Start,
    State,
    allocate,
    effective,
    parse_override,
    partition_value,
)


@pytest.mark.parametrize(
    ("text", "limit", "period"),
    [("50/s", 50, 1.0), ("10/m", 10, 60.0), ("100/h", 100, 3600.0), ("5/10s", 5, 10.0), (" 3 / minute ", 3, 60.0)],
)
def test_rates_parse_from_text(text: str, limit: int, period: float) -> None:
    rate = Rate.parse(text)
    assert (rate.limit, rate.period, rate.burst) == (limit, period, 1)


@pytest.mark.parametrize("bad", ["", "50", "0/s", "5/x", "-1/s", "1.5/s", {"period": 1}, {"limit": 1, "every": 2}, 7])
def test_bad_rates_are_refused_with_a_typed_error(bad: object) -> None:
    with pytest.raises(InvalidOptionError):
        Rate.parse(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", 10_000_001])
def test_bad_concurrency_is_refused(bad: object) -> None:
    with pytest.raises(InvalidOptionError):
        FlowLimit(concurrency=bad)  # type: ignore[arg-type]


def test_an_override_wins_per_field_and_null_lifts_a_limit() -> None:
    declared = FlowLimit(concurrency=3, rate=Rate(50), partition_by="customer_id")
    assert effective(declared, {"concurrency": 1}) == FlowLimit(1, Rate(50), "customer_id")
    assert effective(declared, {"rate": None}) == FlowLimit(3, None, "customer_id")
    assert effective(None, {"rate": {"limit": 5, "period": 60.0, "burst": 1}}) == FlowLimit(None, Rate(5, 60.0))
    assert parse_override({"rate": "20/s"}) == {"rate": {"limit": 20, "period": 1.0, "burst": 1}}
    for bad in ({}, {"partition_by": "x"}, {"concurrency": 0}, {"rate": "fast"}):
        with pytest.raises(InvalidOptionError):
            parse_override(bad)


def test_keys_per_queue_task_and_partition() -> None:
    limits = Limits(
        queues={"mail": FlowLimit(concurrency=10)},
        tasks={"send": FlowLimit(concurrency=1, rate=Rate(10, 60.0), partition_by="customer_id")},
    )
    keys = limits.keys("mail", "send", '{"customer_id": 42, "x": 1}')
    assert keys.concurrency == (("queue:mail", 10), ("task:send|42", 1))
    assert keys.rate == (("task:send|42", Rate(10, 60.0)),)
    assert limits.keys("mail", "send", "{}").concurrency[1] == ("task:send|null", 1)
    assert not limits.limited("other", "other_task")
    assert partition_value('{"k": "' + "x" * 500 + '"}', "k").startswith("sha256:")


def conc(key: str, limit: int) -> JobKeys:
    return JobKeys(concurrency=((key, limit),))


def rated(key: str, rate: Rate) -> JobKeys:
    return JobKeys(rate=((key, rate),))


def test_concurrency_starts_up_to_the_free_slots_and_parks_the_rest() -> None:
    state = State(now=100.0, used={"task:a": 1})
    out = allocate([Candidate(i, conc("task:a", 3)) for i in range(1, 5)], state)
    assert out == [Start(1), Start(2), Park(3, "task:a"), Park(4, "task:a")]
    assert state.used == {"task:a": 3}


def test_a_job_waiting_for_a_slot_spends_no_rate() -> None:
    keys = JobKeys(concurrency=(("task:a", 1),), rate=(("task:a", Rate(1, 1.0)),))
    state = State(now=0.0, used={"task:a": 1})
    assert allocate([Candidate(1, keys)], state) == [Park(1, "task:a")]
    assert state.tat == {}


def test_a_rate_spaces_starts_and_reserves_each_held_job_a_time_of_its_own() -> None:
    state = State(now=10.0)
    out = allocate([Candidate(i, rated("task:r", Rate(50))) for i in range(1, 5)], state)
    assert out[0] == Start(1)
    assert [round(d.at - 10.0, 6) for d in out[1:] if isinstance(d, Reserve)] == [0.02, 0.04, 0.06]
    assert state.tat["task:r"] == pytest.approx(10.08)
    # the held jobs come back at their times and start without spending more
    later = State(now=10.04, tat=dict(state.tat))
    assert allocate([Candidate(3, rated("task:r", Rate(50)), reserved_at=10.04)], later) == [Start(3)]
    assert later.tat == state.tat


def test_a_burst_may_start_at_once_then_the_steady_rate_applies() -> None:
    state = State(now=0.0)
    out = allocate([Candidate(i, rated("q", Rate(10, 1.0, burst=3))) for i in range(5)], state)
    assert [type(d).__name__ for d in out] == ["Start", "Start", "Start", "Reserve", "Reserve"]


def test_a_stale_reservation_is_replaced_by_a_new_one() -> None:
    state = State(now=100.0, tat={"k": 100.5})
    out = allocate([Candidate(1, rated("k", Rate(2)), reserved_at=90.0)], state)
    assert out == [Reserve(1, 100.5)]


def test_multiple_keys_all_must_allow_a_start() -> None:
    keys = JobKeys(concurrency=(("queue:q", 5), ("task:t", 1)))
    state = State(now=0.0)
    assert allocate([Candidate(1, keys), Candidate(2, keys)], state) == [Start(1), Park(2, "task:t")]
    assert state.used == {"queue:q": 1, "task:t": 1}
