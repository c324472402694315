"""postbox.socket_wait.Connection: one reader registration per session, and the rest of psycopg's wait kept.

Each scenario runs on asyncio's own event loop and on uvloop (what postbox's
processes run on, except on Windows).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection

from postbox.socket_wait import WATCH_INTERVAL, Connection


def _loops() -> list[Any]:
    loops: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:  # no uvloop here (Windows): asyncio's own loop only
        return loops
    return [*loops, pytest.param(uvloop.new_event_loop, id="uvloop")]


LOOPS = _loops()


def run(loop_factory: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main)


async def until(condition: Callable[[], Awaitable[bool]], what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        await asyncio.sleep(0.01)


async def turns(n: int) -> None:
    """Let the event loop go round ``n`` times (a reader left on an unread socket fires at each)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def reader_taken_off(conn: Connection, what: str) -> None:
    """Wait until ``conn``'s kept reader is off the loop."""

    async def off() -> bool:
        return conn._reader is not None and not conn._reader.registered

    await until(off, what)


async def backend_pid(conn: AsyncConnection[Any]) -> int:
    row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    assert row is not None
    return int(row[0])


class Counted:
    """The standard loop's add_reader / remove_reader, counted for one descriptor."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        self.added = self.removed = self.fired = 0
        add, remove = loop.add_reader, loop.remove_reader

        def add_reader(fileno: int, callback: Callable[..., Any], *args: Any) -> None:
            if fileno != fd:
                return add(fileno, callback, *args)

            def counted(*a: Any) -> None:
                self.fired += 1
                callback(*a)

            self.added += 1
            return add(fileno, counted, *args)

        def remove_reader(fileno: int) -> bool:
            if fileno == fd:
                self.removed += 1
            return remove(fileno)

        loop.add_reader = add_reader  # type: ignore[method-assign]
        loop.remove_reader = remove_reader  # type: ignore[method-assign]


async def test_a_session_registers_its_socket_once_not_per_round_trip(database_url: str) -> None:
    loop = asyncio.get_running_loop()
    plain = await AsyncConnection.connect(database_url, autocommit=True)
    kept = await Connection.connect(database_url, autocommit=True)
    try:
        counts = {name: Counted(loop, c.pgconn.socket) for name, c in (("plain", plain), ("kept", kept))}
        for _ in range(200):
            for c in (plain, kept):
                cur = await c.execute("SELECT 1")
                assert await cur.fetchone() == (1,)
        plain_waits = counts["plain"].added
        assert plain_waits >= 200 and counts["plain"].removed == plain_waits  # psycopg's own: per wait
        assert (counts["kept"].added, counts["kept"].removed) == (1, 0)
        # A wake-up per answer, and on this loop one more: it runs a reader's callback one turn after
        # the task it woke, when the answer is read already (the callback sees that and keeps the reader).
        assert 200 <= counts["kept"].fired <= 2 * plain_waits
    finally:
        await plain.close()
        await kept.close()
    assert counts["kept"].removed == 1  # close() takes the reader off first


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_notify_on_an_idle_session_lets_the_reader_go_and_is_still_delivered(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], database_url: str
) -> None:
    async def main() -> None:
        listener = await Connection.connect(database_url, autocommit=True)
        sender = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
        try:
            await listener.execute("LISTEN socket_wait_test")
            assert listener._reader is not None and listener._reader.registered
            await sender.execute("NOTIFY socket_wait_test, 'hello'")

            await reader_taken_off(listener, "the reader taken off after readiness nobody asked for")
            await turns(50)  # nothing fires again: the loop is not spinning on the unread socket
            assert listener._reader is not None and not listener._reader.registered
            got = [n.payload async for n in listener.notifies(timeout=10, stop_after=1)]
            assert got == ["hello"]
            cur = await listener.execute("SELECT 2")  # the reader comes back for the next answer
            assert await cur.fetchone() == (2,)
            assert listener._reader.registered
        finally:
            await listener.close()
            await sender.close()

    run(loop_factory, main())


async def test_readiness_nobody_asked_for_takes_the_reader_off_once(database_url: str) -> None:
    loop = asyncio.get_running_loop()
    listener = await Connection.connect(database_url, autocommit=True)
    sender = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    try:
        counted = Counted(loop, listener.pgconn.socket)
        await listener.execute("LISTEN socket_wait_test")
        await turns(5)
        assert (counted.added, counted.removed) == (1, 0)  # kept after the answer
        await sender.execute("NOTIFY socket_wait_test, 'x'")

        async def let_go() -> bool:
            return counted.removed == 1

        await until(let_go, "the unasked readiness seen")
        fired = counted.fired
        await turns(50)
        assert (counted.fired, counted.added, counted.removed) == (fired, 1, 1)  # nothing fires on the unread socket
    finally:
        await listener.close()
        await sender.close()


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_server_hanging_up_an_idle_session_is_an_operational_error_not_a_spinning_loop(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], database_url: str
) -> None:
    async def main() -> None:
        victim = await Connection.connect(database_url, autocommit=True)
        admin = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
        try:
            await admin.execute("SELECT pg_terminate_backend(%s)", [await backend_pid(victim)])
            await reader_taken_off(victim, "the reader taken off when the server hung up")
            with pytest.raises(psycopg.OperationalError):
                await victim.execute("SELECT 1")
        finally:
            await victim.close()
            await admin.close()

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_cancelled_query_is_cancelled_on_the_server_and_the_session_goes_on(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], database_url: str
) -> None:
    async def main() -> None:
        conn = await Connection.connect(database_url, autocommit=True)
        admin = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
        try:
            pid = await backend_pid(conn)

            async def state() -> str | None:
                got = await (await admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", [pid])).fetchone()
                return None if got is None else got[0]

            task = asyncio.create_task(conn.execute("SELECT pg_sleep(60)"))

            async def sleeping() -> bool:
                return await state() == "active"

            await until(sleeping, "the query running on the server")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

            async def idle() -> bool:
                return await state() == "idle"

            await until(idle, "the server's query cancelled (not left running its 60 s)")
            cur = await conn.execute("SELECT 3")
            assert await cur.fetchone() == (3,)
        finally:
            await conn.close()
            await admin.close()

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_waits_with_a_timeout_take_psycopgs_path_and_the_kept_reader_comes_back(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], database_url: str
) -> None:
    async def main() -> None:
        conn = await Connection.connect(database_url, autocommit=True)
        try:
            await conn.execute("LISTEN socket_wait_quiet")
            assert conn._reader is not None and conn._reader.registered
            assert [n async for n in conn.notifies(timeout=0.2)] == []  # psycopg's own wait, reader off first
            assert not conn._reader.registered
            for i in range(20):
                cur = await conn.execute("SELECT %s::int", [i])
                assert await cur.fetchone() == (i,)
            assert conn._reader.registered
        finally:
            await conn.close()
        assert conn._reader is None  # close() took it off and dropped it

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_an_answer_slower_than_the_watch_interval_still_arrives_once(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], database_url: str
) -> None:
    """The watch registers a long wait afresh each interval and lets it look again: the answer is unchanged."""

    async def main() -> None:
        conn = await Connection.connect(database_url, autocommit=True)
        try:
            for _ in range(2):
                cur = await conn.execute("SELECT pg_sleep(%s), 7", [4 * WATCH_INTERVAL])
                assert await cur.fetchall() == [("", 7)]
            cur = await conn.execute("SELECT 8")
            assert await cur.fetchone() == (8,)
            assert conn._reader is not None and conn._reader.registered
        finally:
            await conn.close()

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_query_larger_than_the_socket_buffer_goes_out_through_psycopgs_wait(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send the kernel cannot take at once (the socket not writable): psycopg's wait, then the kept reader again."""
    psycopg_waits = 0
    psycopg_wait = AsyncConnection.wait

    async def counted(self: AsyncConnection[Any], *args: Any, **kwargs: Any) -> Any:
        nonlocal psycopg_waits
        psycopg_waits += 1
        return await psycopg_wait(self, *args, **kwargs)

    monkeypatch.setattr(AsyncConnection, "wait", counted)

    async def main() -> None:
        conn = await Connection.connect(database_url, autocommit=True)
        try:
            big = "x" * (32 * 1024 * 1024)
            for _ in range(2):
                cur = await conn.execute("SELECT length(%s::text)", [big])
                assert await cur.fetchone() == (len(big),)
            # At least one of the two sends found the socket full (32 MB against a few MB of buffer); the
            # other may not have: a server that reads as fast as we write leaves it writable at every look.
            assert 1 <= psycopg_waits <= 2
            cur = await conn.execute("SELECT 9")
            assert await cur.fetchone() == (9,)
            assert conn._reader is not None and conn._reader.registered
        finally:
            await conn.close()

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_pipeline_that_never_waits_still_lets_other_tasks_run(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], database_url: str
) -> None:
    """A pipeline sends without waiting for answers: the wait yields to the loop every few ms, as psycopg's."""

    async def main() -> None:
        conn = await Connection.connect(database_url, autocommit=True)
        ticks = 0
        sending = True

        async def ticker() -> None:
            nonlocal ticks
            while sending:
                ticks += 1
                await asyncio.sleep(0)

        try:
            await conn.execute("CREATE TEMP TABLE sent (n int8)")
            task = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            async with conn.pipeline():
                cur = conn.cursor()
                started = time.monotonic()
                before = ticks
                for n in range(20_000):
                    await cur.execute("INSERT INTO sent VALUES (%s)", [n])
                    if time.monotonic() - started > 0.05:
                        break  # 50 ms of sending: long enough to have yielded several times
                during = ticks - before
            sending = False
            await task
            assert during >= 3
        finally:
            await conn.close()

    run(loop_factory, main())
