"""``postbox worker run --processes N``: one supervisor process, N ordinary worker processes.

Each child is ``python -m postbox.worker run`` with the supervisor's flags (minus ``--processes``) and
environment, ``POSTBOX_WORKER_PROCESSES=1``; with ``POSTBOX_WORKER_METRICS_PORT`` set, child ``i``
serves its metrics on that port + ``i``. Children write to the supervisor's stdout and stderr and run in
their own process group, so a terminal's Ctrl-C reaches them once, through the supervisor.

- SIGTERM/SIGINT: forwarded to every child (each drains, ``worker/shutdown.py``); the supervisor waits
  for all of them and exits 0 if all exited 0, else the worst status (3: a child's drain was forced; a
  child killed by signal ``S`` counts as 128 + ``S``). Every further signal is forwarded again: the
  children end their drain at once. A repeat goes to each child as the other stop signal when the
  same one was the last it was sent (:func:`forwarded_signal`): two of one signal sent back to back
  can reach a process as one, and the child would go on draining.
- A child that ends while the supervisor is not stopping is restarted after a delay
  (:class:`RestartPolicy`: 1 s, doubling to 30 s, back to 1 s for a child that ran 60 s), with one log
  line naming its pid, how it ended and the delay.
- A child that exits 2 (bad settings, a task module that fails to import, a schema older than the
  code: its own message says which) is a configuration error: restarting would repeat it. The
  supervisor stops the others and exits 2.
- On Linux each child asks the kernel for SIGTERM when the supervisor dies (``prctl(PR_SET_PDEATHSIG)``),
  so a SIGKILLed supervisor leaves no worker behind: they drain and exit. Elsewhere they run on.

:class:`Supervisor` decides (pure, time passed in); :func:`supervise` does the processes and signals.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

EXIT_CONFIG = 2  # worker/cli.py: bad settings, a task module error, an outdated schema
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
POLL = 1.0  # seconds between looks at the children when no signal wakes the supervisor
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class RestartPolicy:
    """How long to wait before restarting a worker process that ended unexpectedly."""

    first: float = 1.0
    cap: float = 30.0
    reset_after: float = 60.0  # a process that ran this long starts the backoff afresh

    def next_delay(self, previous: float | None, ran_for: float) -> float:
        """The delay after a process that ran ``ran_for`` seconds; ``previous`` is its slot's last delay."""
        if previous is None or ran_for >= self.reset_after:
            return self.first
        return min(self.cap, previous * 2)


def exit_status(returncode: int) -> int:
    """A child's return code as a shell reports it: killed by signal ``S`` (``-S``) is 128 + ``S``."""
    return 128 - returncode if returncode < 0 else returncode


def describe(returncode: int) -> str:
    """How a child ended, for a log line: ``exited with status 1``, ``was killed by SIGKILL``."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"


@dataclass
class Slot:
    """One of the N places a worker process runs in; a restarted process takes its predecessor's slot."""

    index: int
    pid: int | None = None
    started_at: float = 0.0
    delay: float | None = None  # the last restart delay (None: never restarted, or reset)
    start_at: float | None = 0.0  # when to start a process here; None: not to be started


@dataclass(frozen=True)
class Ended:
    """What :meth:`Supervisor.ended` decided about a process that ended."""

    slot: int
    restart_in: float | None  # seconds until its replacement starts; None: no replacement
    config_error: bool = False
    stop: list[int] = field(default_factory=list)  # pids to send SIGTERM to (a configuration error)


class Supervisor:
    """The supervisor's decisions, made from events; the caller starts, signals and reaps the processes."""

    def __init__(self, processes: int, policy: RestartPolicy = RestartPolicy()) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes}")
        self.slots = [Slot(index) for index in range(processes)]
        self.policy = policy
        self.stopping = False
        self.signals = 0  # stop signals received
        self.config_error = False
        self._statuses: list[int] = []  # exit statuses of the processes that ended once stopping

    def running(self) -> list[int]:
        return [slot.pid for slot in self.slots if slot.pid is not None]

    def due(self, now: float) -> list[int]:
        """The slots where a process is to be started now."""
        if self.stopping:
            return []
        return [s.index for s in self.slots if s.pid is None and s.start_at is not None and s.start_at <= now]

    def started(self, index: int, pid: int, now: float) -> None:
        slot = self.slots[index]
        slot.pid, slot.started_at, slot.start_at = pid, now, None

    def next_start(self, now: float) -> float | None:
        """Seconds until the next pending start, None when none is pending."""
        pending = [s.start_at for s in self.slots if s.pid is None and s.start_at is not None]
        if self.stopping or not pending:
            return None
        return max(0.0, min(pending) - now)

    def stop(self) -> list[int]:
        """A stop signal arrived: no more starts; the pids to forward it to (every running process)."""
        self.signals += 1
        self.stopping = True
        for slot in self.slots:
            slot.start_at = None
        return self.running()

    def ended(self, pid: int, returncode: int, now: float) -> Ended:
        """The process ``pid`` ended with ``returncode`` (``Popen.returncode``: ``-S`` when killed by signal S)."""
        slot = next(s for s in self.slots if s.pid == pid)
        slot.pid = None
        if self.stopping:
            # Killed by the very signal forwarded to it: it had not yet set up its handlers, so it
            # had started nothing; it stopped as asked.
            stopped_as_asked = returncode in (-signal.SIGTERM, -signal.SIGINT)
            self._statuses.append(0 if stopped_as_asked else exit_status(returncode))
            return Ended(slot.index, None)
        if returncode == EXIT_CONFIG:
            self.config_error = True
            self.stopping = True
            for other in self.slots:
                other.start_at = None
            return Ended(slot.index, None, config_error=True, stop=self.running())
        slot.delay = self.policy.next_delay(slot.delay, now - slot.started_at)
        slot.start_at = now + slot.delay
        return Ended(slot.index, slot.delay)

    @property
    def finished(self) -> bool:
        return self.stopping and not self.running()

    def exit_status(self) -> int:
        """2 after a configuration error; else 0 if every process stopped cleanly, else the worst status."""
        if self.config_error:
            return EXIT_CONFIG
        return max(self._statuses, default=0)


@dataclass(frozen=True)
class Command:
    """How to start the worker process of one slot."""

    argv: list[str]
    env: dict[str, str]


def forwarded_signal(received: int, last_sent: int | None) -> int:
    """The stop signal to send a child for ``received``, given the last one it was sent (None: none).

    The kernel keeps one pending instance of each signal: two SIGTERMs sent before the child runs
    arrive as one, and a second signal meant to end its drain would be lost. The other stop signal
    (a worker treats SIGTERM and SIGINT alike) is always delivered as a signal of its own.
    """
    if received != last_sent:
        return received
    return signal.SIGINT if received == signal.SIGTERM else signal.SIGTERM


def parent_death_signal() -> Callable[[], None] | None:
    """Linux: a ``preexec_fn`` that has the child sent SIGTERM when the supervisor dies; elsewhere None."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child, between fork and exec, only calls it
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before the prctl: no signal would come
            os._exit(1)

    return preexec


def supervise(
    processes: int,
    command: Callable[[int], Command],
    *,
    policy: RestartPolicy = RestartPolicy(),
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run ``processes`` worker processes (``command(slot)`` each) until they have stopped; the exit status."""
    plan = Supervisor(processes, policy)
    children: dict[int, subprocess.Popen[bytes]] = {}
    received: list[int] = []
    sent: dict[int, int] = {}  # pid -> the last stop signal forwarded to it
    preexec = parent_death_signal()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    previous_fd = signal.set_wakeup_fd(wake_w)  # a signal wakes the select below
    previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum)) for sig in STOP_SIGNALS}
    previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    log.info("worker supervisor %d: running %d worker processes", os.getpid(), processes)
    try:
        while True:
            while received:
                signum = received.pop(0)
                pids = plan.stop()
                name = signal.Signals(signum).name
                if plan.signals == 1:
                    log.info("%s: stopping; forwarded to worker processes %s", name, _pids(pids))
                else:
                    log.warning(
                        "%s again: forwarded to worker processes %s (they end their drain now)", name, _pids(pids)
                    )
                for pid in pids:
                    sent[pid] = forwarded_signal(signum, sent.get(pid))
                    _send(children[pid], sent[pid])
            now = clock()
            for pid, proc in list(children.items()):
                returncode = proc.poll()
                if returncode is None:
                    continue
                del children[pid]
                ended = plan.ended(pid, returncode, now)
                if ended.config_error:
                    log.error(
                        "worker process %d exited with status 2: a configuration error (its message is above); "
                        "stopping worker processes %s",
                        pid,
                        _pids(ended.stop),
                    )
                    for other in ended.stop:
                        _send(children[other], signal.SIGTERM)
                elif ended.restart_in is not None:
                    log.warning(
                        "worker process %d %s; restarting it in %.1f s", pid, describe(returncode), ended.restart_in
                    )
                else:
                    log.info("worker process %d %s", pid, describe(returncode))
            if plan.finished:
                status = plan.exit_status()
                log.info("worker supervisor %d: every worker process has ended; exit status %d", os.getpid(), status)
                return status
            for index in plan.due(now):
                spec = command(index)
                proc = subprocess.Popen(
                    spec.argv, env=spec.env, stdin=subprocess.DEVNULL, process_group=0, preexec_fn=preexec
                )
                children[proc.pid] = proc
                plan.started(index, proc.pid, now)
                log.info("worker process %d started (slot %d)", proc.pid, index)
            wait = plan.next_start(now)
            select.select([wake_r], [], [], POLL if wait is None else min(POLL, wait))
            _drain(wake_r)
    finally:
        for proc in children.values():  # only after an unexpected error: they would run on unsupervised
            _send(proc, signal.SIGTERM)
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(wake_r)
        os.close(wake_w)


def _pids(pids: list[int]) -> str:
    return ", ".join(map(str, pids)) or "(none running)"


def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
    try:
        proc.send_signal(signum)  # does nothing once the process has been reaped
    except ProcessLookupError:
        pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
