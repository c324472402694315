"""The worker supervisor's decisions (worker/supervisor.py): restarts, backoff, exit status; time passed in."""

from __future__ import annotations

import signal

import pytest

from postbox.worker.supervisor import Ended, RestartPolicy, Supervisor, describe, exit_status, forwarded_signal

SIGKILL = -signal.SIGKILL


def test_the_restart_delay_doubles_to_its_cap_and_starts_afresh_after_a_long_run() -> None:
    policy = RestartPolicy(first=1.0, cap=30.0, reset_after=60.0)
    delays: list[float] = []
    previous: float | None = None
    for _ in range(7):
        previous = policy.next_delay(previous, ran_for=0.5)
        delays.append(previous)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert policy.next_delay(30.0, ran_for=59.9) == 30.0
    assert policy.next_delay(30.0, ran_for=60.0) == 1.0


def test_exit_statuses_and_how_an_end_is_described() -> None:
    assert [exit_status(code) for code in (0, 1, 3, SIGKILL, -signal.SIGTERM)] == [0, 1, 3, 137, 143]
    assert describe(1) == "exited with status 1"
    assert describe(SIGKILL) == "was killed by SIGKILL"


def test_every_slot_starts_at_once_and_no_slot_twice() -> None:
    plan = Supervisor(3)
    assert plan.due(0.0) == [0, 1, 2]
    for index, pid in enumerate((101, 102, 103)):
        plan.started(index, pid, 0.0)
    assert plan.due(100.0) == []
    assert plan.running() == [101, 102, 103]
    assert plan.next_start(0.0) is None
    assert not plan.finished


def test_a_process_that_dies_is_restarted_in_its_slot_after_a_growing_delay() -> None:
    plan = Supervisor(2)
    plan.started(0, 101, 0.0)
    plan.started(1, 102, 0.0)

    assert plan.ended(101, SIGKILL, 5.0) == Ended(slot=0, restart_in=1.0)
    assert plan.running() == [102]
    assert plan.due(5.5) == [] and plan.next_start(5.5) == 0.5
    assert plan.due(6.0) == [0]
    plan.started(0, 103, 6.0)
    assert plan.ended(103, 1, 7.0) == Ended(slot=0, restart_in=2.0)  # died again quickly: twice the delay
    assert plan.due(8.9) == [] and plan.due(9.0) == [0]
    plan.started(0, 104, 9.0)
    assert plan.ended(104, 0, 69.0).restart_in == 1.0  # ran 60 s: the backoff starts afresh
    # The other slot has its own backoff.
    assert plan.ended(102, SIGKILL, 70.0).restart_in == 1.0
    assert plan.exit_status() == 0 and not plan.finished


def test_a_stop_is_forwarded_to_every_running_process_each_time_and_cancels_pending_restarts() -> None:
    plan = Supervisor(3)
    for index, pid in enumerate((101, 102, 103)):
        plan.started(index, pid, 0.0)
    plan.ended(103, SIGKILL, 1.0)  # its restart is pending
    assert plan.stop() == [101, 102]
    assert plan.signals == 1 and plan.due(100.0) == [] and plan.next_start(1.0) is None
    assert plan.ended(101, 0, 2.0) == Ended(slot=0, restart_in=None)
    assert plan.stop() == [102]  # the second signal: to those still running
    assert plan.signals == 2 and not plan.finished
    assert plan.ended(102, 0, 3.0) == Ended(slot=1, restart_in=None)
    assert plan.finished and plan.exit_status() == 0


@pytest.mark.parametrize(
    ("codes", "status"),
    [
        ((0, 0), 0),
        ((0, 3), 3),  # a child's drain was forced
        ((3, 1), 3),
        ((0, SIGKILL), 137),
        ((-signal.SIGTERM, -signal.SIGINT), 0),  # ended by the forwarded signal before its handlers: stopped
    ],
)
def test_the_exit_status_after_a_stop_is_the_worst_childs(codes: tuple[int, int], status: int) -> None:
    plan = Supervisor(2)
    plan.started(0, 101, 0.0)
    plan.started(1, 102, 0.0)
    plan.stop()
    plan.ended(101, codes[0], 1.0)
    plan.ended(102, codes[1], 1.0)
    assert plan.finished and plan.exit_status() == status


def test_a_configuration_error_stops_the_others_instead_of_restarting() -> None:
    plan = Supervisor(3)
    for index, pid in enumerate((101, 102, 103)):
        plan.started(index, pid, 0.0)
    assert plan.ended(102, 2, 1.0) == Ended(slot=1, restart_in=None, config_error=True, stop=[101, 103])
    assert plan.stopping and plan.due(100.0) == []
    plan.ended(101, 2, 1.0)  # the others may report the same error
    assert not plan.finished
    plan.ended(103, 0, 1.5)
    assert plan.finished and plan.exit_status() == 2


def test_a_process_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Supervisor(0)


def test_a_repeated_stop_signal_is_forwarded_as_the_other_one_so_it_is_not_merged_with_the_first() -> None:
    term, intr = signal.SIGTERM, signal.SIGINT
    assert forwarded_signal(term, None) == term  # the first goes as it came
    assert forwarded_signal(intr, None) == intr
    assert forwarded_signal(term, term) == intr  # SIGTERM twice: the child gets SIGTERM, then SIGINT
    assert forwarded_signal(term, intr) == term
    assert forwarded_signal(intr, intr) == term
    sent = None
    for _ in range(4):  # each forward differs from the one before it, whatever arrives
        nxt = forwarded_signal(term, sent)
        assert nxt != sent
        sent = nxt
