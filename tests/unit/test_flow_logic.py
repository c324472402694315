"""Flow control's logic: limits, keys, overrides and the allocation of a batch (no I/O)."""

from __future__ import annotations

import itertools

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
from postbox.registry import Registry, limit_queue, task


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


@pytest.mark.parametrize(
    "bad", ["5/.s", "5/./s", "9" * 5000 + "/s", "5/" + "9" * 5000 + "s", "5/1e9s", {"limit": 10**5000}, "x" * 10_000]
)
def test_rates_that_reached_int_and_float_are_refused_naming_the_field(bad: object) -> None:
    """Issue 29 item 7: ``float('.')`` and ``int()``'s digit limit raised bare ValueErrors."""
    with pytest.raises(InvalidOptionError) as info:
        Rate.parse(bad)  # type: ignore[arg-type]
    assert info.value.field == "rate" and len(str(info.value)) < 200


def test_task_and_queue_declarations_refuse_a_bad_rate_naming_the_field() -> None:
    with pytest.raises(InvalidOptionError) as info:

        @task(name="rated", rate="5/.s", registry=Registry())
        async def rated(ctx: object) -> None: ...

    assert info.value.field == "rate"
    with pytest.raises(InvalidOptionError) as info:
        limit_queue("q1", rate="5/.s")
    assert info.value.field == "rate"
    with pytest.raises(InvalidOptionError) as info:
        FlowLimit(concurrency=10**5000)
    assert info.value.field == "concurrency" and "bits" in str(info.value)


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
    assert all(d.token_at == d.at for d in out[1:] if isinstance(d, Reserve))
    assert state.tat["task:r"] == pytest.approx(10.08)
    assert state.stat["task:r"] == pytest.approx(10.02)  # one start so far
    # a held job comes back at its time and starts without taking another token
    later = State(now=10.04, tat=dict(state.tat), stat=dict(state.stat))
    assert allocate([Candidate(3, rated("task:r", Rate(50)), reserved_at=10.04)], later) == [Start(3)]
    assert later.tat == state.tat
    assert later.stat["task:r"] == pytest.approx(10.04)  # on schedule: the start cell keeps its own pace


def test_a_burst_may_start_at_once_then_the_steady_rate_applies() -> None:
    state = State(now=0.0)
    out = allocate([Candidate(i, rated("q", Rate(10, 1.0, burst=3))) for i in range(5)], state)
    assert [type(d).__name__ for d in out] == ["Start", "Start", "Start", "Reserve", "Reserve"]


def test_late_jobs_keep_their_tokens_but_never_start_in_a_clump() -> None:
    """Three held jobs published behind a backlog arrive together, long after their times."""
    rate = rated("k", Rate(10))  # 0.1 s apart
    state = State(now=100.0, tat={"k": 101.0}, stat={"k": 99.5})
    out = allocate([Candidate(i, rate, reserved_at=97.0 + i * 0.1) for i in range(3)], state)
    assert out[0] == Start(0)
    # tokens kept (their stamps), start times spread an interval apart (half an interval of slack)
    assert out[1] == Reserve(1, pytest.approx(100.05), 97.1)
    assert out[2] == Reserve(2, pytest.approx(100.15), 97.2)
    assert state.tat == {"k": 101.0}  # no new token taken: the late jobs already had theirs
    # back at their times, each starts
    again = State(now=100.05, tat=dict(state.tat), stat=dict(state.stat))
    assert allocate([Candidate(1, rate, reserved_at=97.1)], again) == [Start(1)]
    again.now = 100.15
    assert allocate([Candidate(2, rate, reserved_at=97.2)], again) == [Start(2)]
    assert again.stat["k"] == pytest.approx(100.3)


def test_starts_never_come_closer_than_half_an_interval() -> None:
    rate = rated("k", Rate(10))
    state = State(now=0.0)
    starts = []
    for step in range(200):  # jobs holding tokens arrive every 10 ms
        state.now = step * 0.01
        if allocate([Candidate(step, rate, reserved_at=0.0)], state) == [Start(step)]:
            starts.append(state.now)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.05 - 1e-9
    assert len(starts) == pytest.approx(20, abs=1)  # 10 per second over 2 s: the cell keeps the schedule


def test_an_idle_key_gives_a_token_now_but_waits_for_the_spacing_of_recent_starts() -> None:
    state = State(now=50.0, tat={"k": 49.0}, stat={"k": 50.2})
    out = allocate([Candidate(1, rated("k", Rate(10)))], state)
    assert out == [Reserve(1, pytest.approx(50.15), 50.0)]  # token at now, start after the spacing
    assert state.tat["k"] == pytest.approx(50.1)


def test_multiple_keys_all_must_allow_a_start() -> None:
    keys = JobKeys(concurrency=(("queue:q", 5), ("task:t", 1)))
    state = State(now=0.0)
    assert allocate([Candidate(1, keys), Candidate(2, keys)], state) == [Start(1), Park(2, "task:t")]
    assert state.used == {"queue:q": 1, "task:t": 1}
