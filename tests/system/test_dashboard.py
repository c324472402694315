"""The web dashboard in a real browser: headless Debian chromium driven by Playwright, against a real
``postbox api run`` (and, for the live test, a real relay and worker) on real PostgreSQL and Redis.

Skipped, with the reason in the summary (``-rs``), where ``/usr/bin/chromium`` or Playwright is missing;
``.ci/run`` installs chromium so CI always runs them. Set ``POSTBOX_DASHBOARD_SHOTS=<dir>`` to save
screenshots of the main pages there (docs/dashboard/*.png are made that way).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis

from postbox import events
from postbox.streams import events_channel
from tests.harness.fleet import child
from tests.harness.redis_server import free_port
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
KEY = "dash-s3cret"
TIMEOUT_MS = 20_000

try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright

    # expect() waits 5 s by default, whatever the page's timeout: too short for a busy 2-core
    # machine where a worker must run the requeued jobs before the page can show them.
    expect.set_options(timeout=TIMEOUT_MS)
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

if sync_playwright is None or not os.path.exists(CHROMIUM):
    pytestmark = [
        pytest.mark.system,
        pytest.mark.skip(
            reason=f"dashboard browser tests SKIPPED: needs {CHROMIUM} (apt-get install chromium) and playwright"
        ),
    ]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class Api:
    """``postbox api run`` on a fixed port, restartable."""

    def __init__(self, env: dict[str, str], log_dir: Path, *extra: str) -> None:
        self.env = env
        self.extra = list(extra)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"api-{self.starts}.log", "wb")
        argv = [sys.executable, "-m", "postbox.app", "api", "run", "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(argv + self.extra, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        try:
            wait_until(lambda: _healthy(self.url), 30)
        except AssertionError:
            raise AssertionError((self.log_dir / f"api-{self.starts}.log").read_text()) from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@contextmanager
def api_process(env: dict[str, str], log_dir: Path, *extra: str) -> Iterator[Api]:
    api = Api(env, log_dir, *extra)
    api.start()
    try:
        yield api
    finally:
        api.stop()


class PrefixProxy:
    """A reverse proxy serving ``upstream`` under ``/<prefix>/`` (the prefix stripped), WebSockets included.

    One request per connection (``Connection: close`` unless upgrading), which is all a test needs.
    """

    def __init__(self, upstream_port: int, prefix: str) -> None:
        self.upstream_port = upstream_port
        self.prefix = prefix.encode()
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PrefixProxy:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self.ready.set()
        self.loop.run_forever()

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        first, *headers = head[:-4].split(b"\r\n")
        method, target, version = first.split(b" ")
        if not target.startswith(self.prefix + b"/"):
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        upgrade = any(h.lower().startswith(b"upgrade:") for h in headers)
        if not upgrade:
            headers = [h for h in headers if not h.lower().startswith(b"connection:")] + [b"Connection: close"]
        new_head = b"\r\n".join([b" ".join([method, target[len(self.prefix) :], version]), *headers]) + b"\r\n\r\n"
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        up_writer.write(new_head)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@pytest.fixture
def browser() -> Iterator[Browser]:
    assert sync_playwright is not None
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _shot(page: Page, name: str) -> None:
    folder = os.environ.get("POSTBOX_DASHBOARD_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def _open(page: Page, url: str, loaded: str) -> None:
    page.goto(url)
    page.wait_for_selector(f"body[data-loaded={loaded}]", timeout=TIMEOUT_MS)


def _go(page: Page, hash_: str, loaded: str) -> None:
    page.evaluate("h => { window.location.hash = h }", hash_)
    page.wait_for_selector(f"body[data-loaded={loaded}]", timeout=TIMEOUT_MS)


def _seed(database_url: str) -> dict[str, Any]:
    """Jobs in several states, a stored traceback, a live and a stale worker, a leading relay, a schedule."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO postbox.outbox (queue, task, args, state, attempts, created_at, available_at, published_at,
                                        started_at, finished_at, claimed_by)
            SELECT 'apiq', 'api_echo', jsonb_build_object('text', 'hello-' || i), 'succeeded', 1,
                   now() - make_interval(mins => i), now() - make_interval(mins => i),
                   now() - make_interval(mins => i), now() - make_interval(mins => i) + interval '20 ms',
                   now() - make_interval(mins => i) + interval '50 ms', 'worker-live0001'
              FROM generate_series(1, 40) AS i
            """
        )
        dead = [
            int(row[0])
            for row in conn.execute(
                """
                INSERT INTO postbox.outbox (queue, task, args, state, attempts, max_attempts, created_at, available_at,
                                            started_at, finished_at, last_error_class, last_error)
                SELECT 'apiq', 'api_sum', jsonb_build_object('a', i), 'dead', 2, 2, now() - interval '3 min',
                       now() - interval '3 min', now() - interval '2 min',
                       now() - interval '1 min', 'ValueError', 'bad input ' || i
                  FROM generate_series(1, 3) AS i
                RETURNING id
                """
            ).fetchall()
        ]
        conn.execute(
            """
            INSERT INTO postbox.job_attempts (outbox_id, attempt, worker_id, started_at, finished_at, outcome,
                                              error_class, error, traceback)
            VALUES (%s, 1, 'worker-live0001', now() - interval '2 min', now() - interval '1 min', 'dead',
                    'ValueError', 'bad input', %s)
            """,
            (dead[0], 'Traceback (most recent call last):\n  File "tasks.py", line 7\nValueError: bad input'),
        )
        row = conn.execute(
            """INSERT INTO postbox.outbox (queue, task, args, headers, state)
               VALUES ('apiq', 'api_echo', '{"text": "needle-42"}', '{"request_id": "req-77"}', 'queued')
               RETURNING id"""
        ).fetchone()
        assert row is not None
        needle = int(row[0])
        conn.execute(
            """
            INSERT INTO postbox.workers (id, host, pid, queues, concurrency, last_seen, in_flight, processed)
            VALUES ('worker-live0001', 'host-a', 101, '{apiq}', 4, now(), 1, 40),
                   ('worker-stale002', 'host-b', 102, '{apiq}', 2, now() - interval '1 hour', 0, 3)
            """
        )
        conn.execute(
            "INSERT INTO postbox.relays (id, host, pid, role, term) VALUES ('relay-1', 'host-r', 201, 'leader', 3)"
        )
        conn.execute(
            """
            INSERT INTO postbox.schedules (name, task, queue, priority, max_attempts, every_seconds, cursor_at,
                                           next_run_at)
            VALUES ('echo-hourly', 'api_echo', 'apiq', 5, 3, 3600, now(), now() + interval '1 hour')
            """
        )
    return {"dead": dead, "needle": needle}


def test_every_page_login_filters_pause_csrf_and_deep_link(
    browser: Browser, child_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    seeded = _seed(database_url)
    env = {**child_env, "POSTBOX_TASKS": "tests.harness.tasks.api", "POSTBOX_API_KEY": KEY}
    with api_process(env, tmp_path) as api:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        base = api.url + "/"

        # Overview: queue counts, the last hour, latency, the relay leader, workers alive.
        _open(page, base, "overview")
        expect(page.locator("tr[data-queue=apiq]")).to_contain_text("apiq")
        expect(page.locator("#card-finished .value")).to_have_text("40")
        expect(page.locator("#card-dead .value")).to_have_text("3")
        # without the key a relay's host and pid are withheld: the card names the relay's id
        expect(page.locator("#card-leader .value")).to_have_text("relay-1")
        expect(page.locator("#card-workers .value")).to_have_text("1 (+1 stale)")
        expect(page.locator("#card-p50 .value")).to_have_text("20 ms")
        assert page.locator("#throughput rect.ok").count() == 60
        expect(page.locator("#live")).to_have_text("live")
        _shot(page, "overview")

        # Jobs: a state filter, kept in the address; args search needs the key.
        _go(page, "#/jobs", "jobs")
        expect(page.locator("input[name=text]")).to_be_disabled()
        page.select_option("select[name=state]", "dead")
        page.click("#filters button[type=submit]")
        page.wait_for_function("() => window.location.hash === '#/jobs?state=dead'")
        page.wait_for_selector("body[data-loaded=jobs]")
        expect(page.locator("tr[data-state]")).to_have_count(3)
        assert set(page.locator("tr[data-state]").evaluate_all("rows => rows.map(r => r.dataset.state)")) == {"dead"}
        _go(page, "#/jobs", "jobs")
        expect(page.locator("tr[data-state]")).to_have_count(44)
        expect(page.locator("#page-next")).to_be_disabled()

        # A deep link, before logging in: args, headers, errors and tracebacks withheld.
        job_page = context.new_page()
        _open(job_page, f"{base}#/jobs/{seeded['dead'][0]}", "job")
        expect(job_page.locator("#job-state")).to_have_text("dead")
        expect(job_page.locator("#job-args")).to_contain_text("redacted")
        expect(job_page.locator("pre.error")).to_have_count(0)
        expect(job_page.locator("pre.traceback")).to_have_count(0)
        # created, due, attempt 1 started and ended, finished (never published: seeded by SQL)
        expect(job_page.locator("#timeline li")).to_have_count(5)
        expect(job_page.locator("#timeline")).to_contain_text("attempt 1 started on worker-live0001")
        expect(job_page.locator("#timeline")).to_contain_text("finished: dead")
        expect(job_page.locator("#job-requeue")).to_be_disabled()
        job_page.close()

        # Actions are refused before login, by the dashboard and by the API behind it.
        _go(page, "#/queues", "queues")
        expect(page.locator("tr[data-queue=apiq] button")).to_be_disabled()

        # Log in: a wrong key is refused, the right one is kept in an HttpOnly, SameSite=Strict cookie.
        _go(page, "#/login", "login")
        page.fill("#key", "wrong")
        page.click("form.login button")
        expect(page.locator("#login-message")).to_have_text("wrong API key")
        page.fill("#key", KEY)
        page.click("form.login button")
        page.wait_for_selector("#logout")
        page.wait_for_selector("body[data-loaded=overview]")  # the landing page after a login
        cookies = {c["name"]: c for c in context.cookies()}
        assert cookies["postbox_session"]["httpOnly"] is True
        assert cookies["postbox_session"]["sameSite"] == "Strict"
        assert cookies["postbox_session"]["path"] == "/"
        assert cookies["postbox_session"]["value"] != KEY  # a session token, never the key
        assert page.evaluate("document.cookie") == ""

        # Logged in: the dead job's error and traceback, args, headers and a text match on args.
        _go(page, f"#/jobs/{seeded['dead'][0]}", "job")
        expect(page.locator("pre.error")).to_have_text("ValueError: bad input")
        expect(page.locator("pre.traceback")).to_contain_text("Traceback (most recent call last):")
        _go(page, f"#/jobs/{seeded['needle']}", "job")
        expect(page.locator("#job-args")).to_contain_text('"text": "needle-42"')
        expect(page.locator("#job-headers")).to_contain_text('"request_id": "req-77"')
        expect(page.locator("dl.fields")).to_contain_text("taskapi_echoqueueapiqpriority5attempts0 of 5")
        expect(page.locator("#deep-link")).to_have_text(f"{base}#/jobs/{seeded['needle']}")
        _go(page, f"#/jobs/{seeded['dead'][0]}", "job")
        expect(page.locator("#job-args")).to_contain_text('"a": 1')
        page.click("details.traceback summary")
        _shot(page, "job")
        _go(page, "#/jobs?text=needle", "jobs")
        expect(page.locator("tr[data-state]")).to_have_count(1)
        expect(page.locator(f"tr[data-id='{seeded['needle']}']")).to_contain_text("queued")
        _go(page, "#/jobs", "jobs")
        page.locator("tr[data-state=dead] input.row-select").first.check()
        expect(page.locator("#selection")).to_have_text("1 selected")
        _shot(page, "jobs")

        # Pause a queue: confirmed, done through the API with the key, audited.
        _go(page, "#/queues", "queues")
        page.click("tr[data-queue=apiq] button")
        expect(page.locator("#confirm-text")).to_have_text("pause queue apiq?")
        page.click("#confirm-ok")
        expect(page.locator("tr[data-queue=apiq] .queue-state")).to_have_text("paused")
        with psycopg.connect(database_url) as conn:
            paused = conn.execute("SELECT paused FROM postbox.queues WHERE name = 'apiq'").fetchone()
            audit = conn.execute("SELECT actor, action, target FROM postbox.audit_log ORDER BY id").fetchall()
        assert paused == (True,)
        assert [(actor.split(":")[0], action, target) for actor, action, target in audit] == [
            ("unauthenticated", "auth.failed", "client:127.0.0.1"),  # the wrong key above
            ("session", "session.login", audit[1][2]),
            ("session", "queue.pause", "queue:apiq"),
        ]
        _shot(page, "queues")

        # CSRF: the cookie alone does not make an action.
        forged = page.evaluate(
            """async () => {
                const r = await fetch('api/v1/queues/apiq/resume', {method: 'POST'});
                return [r.status, (await r.json()).error.code];
            }"""
        )
        assert forged == [403, "CSRF_FAILED"]

        # Workers (the stale one marked), schedules (pause one).
        _go(page, "#/workers", "workers")
        expect(page.locator("tr.stale")).to_have_count(1)
        expect(page.locator("tr[data-worker=worker-stale002] .worker-status")).to_have_text("stale")
        expect(page.locator("tr[data-worker=worker-live0001] .worker-status")).to_have_text("alive")
        _shot(page, "workers")
        _go(page, "#/schedules", "schedules")
        row = page.locator("tr[data-schedule=echo-hourly]")
        expect(row).to_contain_text("every 3600")
        row.locator("button", has_text="Pause").click()
        page.click("#confirm-ok")
        expect(row).to_contain_text("paused")
        _shot(page, "schedules")
        row.locator("button", has_text="Run now").click()
        expect(page.locator("#confirm-text")).to_have_text("trigger schedule echo-hourly?")
        page.click("#confirm-ok")
        expect(row.locator("a")).to_have_count(1)  # the last job, linked
        _go(page, "#/dlq", "dlq")
        expect(page.locator("tr[data-state=dead]")).to_have_count(3)
        _shot(page, "dead-letters")

        # Dead letters: discard the selected one, then purge the queue's discarded letters (counted first).
        page.locator(f"tr[data-id='{seeded['dead'][0]}'] input.row-select").check()
        page.click("#bulk-discard")
        expect(page.locator("#confirm-text")).to_have_text("Discard: discard 1 selected job?")
        page.click("#confirm-ok")
        expect(page.locator("#bulk-result")).to_have_text("Discard: 1 of 1 done.")
        expect(page.locator(f"tr[data-id='{seeded['dead'][0]}'] .state")).to_have_text("dead discarded")
        page.fill("#purge-queue", "apiq")
        page.check("#purge-discarded")
        page.click("#purge button[type=submit]")
        expect(page.locator("#confirm-text")).to_have_text("Purge: delete 1 dead letters of queue apiq for good?")
        page.click("#confirm-ok")
        expect(page.locator("#bulk-result")).to_have_text("Purged 1 dead letters of apiq.")
        expect(page.locator("tr[data-state=dead]")).to_have_count(2)
        with psycopg.connect(database_url) as conn:
            actions = [r[0] for r in conn.execute("SELECT action FROM postbox.audit_log ORDER BY id").fetchall()]
        assert actions == [
            "auth.failed",
            "session.login",
            "queue.pause",
            "schedule.pause",
            "schedule.trigger",
            "dlq.discard",
            "dlq.purge",
        ]

        # Log out: the cookie is gone and actions are disabled again.
        page.click("#logout")
        page.wait_for_selector("#login-link")
        assert "postbox_session" not in {c["name"] for c in context.cookies()}
        _go(page, "#/queues", "queues")
        expect(page.locator("tr[data-queue=apiq] button")).to_be_disabled()
        context.close()


def test_bulk_requeue_of_dead_letters_changes_states_live_and_survives_an_api_restart(
    browser: Browser, child_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    env = {**child_env, "POSTBOX_TASKS": "tests.harness.tasks.api", "POSTBOX_API_INSECURE": "true"}
    with (
        api_process(env, tmp_path) as api,
        child(["-m", "postbox.relay", "run"], env, tmp_path / "relay.log"),
        child(["-m", "postbox.worker", "run", "--queues", "apiq"], env, tmp_path / "worker.log"),
    ):
        for _ in range(3):
            created = httpx.post(
                api.url + "/api/v1/jobs", json={"task": "api_needs_file", "args": {"path": str(flag)}}, timeout=5
            )
            assert created.status_code == 201

        def dead_count() -> int:
            with psycopg.connect(database_url) as conn:
                row = conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'dead'").fetchone()
            return int(row[0]) if row else 0

        wait_until(lambda: dead_count() == 3, 30)
        flag.write_text("here")

        page = browser.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        _open(page, api.url + "/#/jobs?task=api_needs_file", "jobs")
        expect(page.locator("tr[data-state=dead]")).to_have_count(3)
        page.evaluate("window.__same_document = true")

        page.click("#select-all-matching")
        expect(page.locator("#selection")).to_have_text("All 3 matching the filter selected")
        page.click("#bulk-requeue")
        expect(page.locator("#confirm-text")).to_have_text(
            "Retry: retry (requeue the dead ones of) all 3 jobs matching the filter?"
        )
        page.click("#confirm-ok")
        expect(page.locator("#bulk-result")).to_have_text("Retry: 3 of 3 done.")
        # The worker runs them again: the page follows through the events WebSocket, without a reload.
        expect(page.locator("tr[data-state=succeeded]")).to_have_count(3)
        assert page.evaluate("window.__same_document") is True
        with psycopg.connect(database_url) as conn:
            actions = conn.execute(
                "SELECT action, count(*) FROM postbox.audit_log WHERE action <> 'session.login' GROUP BY action"
            ).fetchall()
        assert actions == [("dlq.requeue", 3)]

        # The API restarts: the page reconnects and keeps following.
        api.stop()
        expect(page.locator("#live")).to_have_text("reconnecting…")
        api.start()
        expect(page.locator("#live")).to_have_text("live")
        created = httpx.post(
            api.url + "/api/v1/jobs", json={"task": "api_needs_file", "args": {"path": str(flag)}}, timeout=5
        )
        assert created.status_code == 201
        expect(page.locator(f"tr[data-id='{created.json()['id']}'][data-state=succeeded]")).to_have_count(1)
        expect(page.locator("tr[data-state=succeeded]")).to_have_count(4)
        assert page.evaluate("window.__same_document") is True
        page.close()


def test_a_page_showing_unfinished_jobs_follows_an_end_that_sent_no_event(
    browser: Browser, child_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    # Events are best effort: a worker learns of a new listener within a second, a reconnect loses what
    # passed. Here jobs end with no event at all (a plain UPDATE): the list of their queue, a job's own page
    # and the overview still show the end, by the slow re-read a page makes while it shows unfinished jobs
    # and no event of its own has asked for one; another queue's events do not hold that re-read back.
    env = {**child_env, "POSTBOX_TASKS": "tests.harness.tasks.api", "POSTBOX_API_INSECURE": "true"}
    with psycopg.connect(database_url, autocommit=True) as conn:
        first, second = (
            row[0]
            for row in conn.execute(
                "INSERT INTO postbox.outbox (queue, task, state) VALUES ('apiq', 'api_echo', 'queued'),"
                " ('apiq', 'api_echo', 'queued') RETURNING id"
            ).fetchall()
        )

    def end(job_id: int) -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("UPDATE postbox.outbox SET state = 'succeeded', finished_at = now() WHERE id = %s", (job_id,))

    with api_process(env, tmp_path) as api:
        jobs = browser.new_page()
        jobs.set_default_timeout(TIMEOUT_MS)
        _open(jobs, api.url + "/#/jobs?queue=apiq", "jobs")
        expect(jobs.locator("tr[data-state=queued]")).to_have_count(2)
        detail = browser.new_page()
        detail.set_default_timeout(TIMEOUT_MS)
        _open(detail, api.url + f"/#/jobs/{first}", "job")
        expect(detail.locator("#job-cancel")).to_have_count(1)  # drawn as unfinished
        overview = browser.new_page()
        overview.set_default_timeout(TIMEOUT_MS)
        _open(overview, api.url + "/", "overview")
        queued = overview.locator("tr[data-queue=apiq] td:nth-child(5)")  # the queue's "queued" count
        expect(queued).to_have_text("2")
        for page in (jobs, detail, overview):
            # Connected, and the re-read a new connection schedules already made: what the page shows
            # from here on comes from a later read.
            page.wait_for_function("() => live.socket && live.socket.readyState === 1 && live.timer === null")

        end(first)  # no event at all
        expect(jobs.locator(f"tr[data-id='{first}'][data-state=succeeded]")).to_have_count(1)
        expect(detail.locator("#job-cancel")).to_have_count(0)
        expect(queued).to_have_text("1")

        stop = threading.Event()

        def other_queue_events() -> None:  # every 0.3 s, none about these jobs or their queue
            with redis.Redis.from_url(env["POSTBOX_REDIS_URL"]) as client:
                while not stop.wait(0.3):
                    evt = events.event("started", job_id=second + 1_000_000, queue="otherq", task="api_echo")
                    client.publish(events_channel(env["POSTBOX_REDIS_PREFIX"]), events.encode(evt))

        jobs.evaluate("window.__heard = 0; live.socket.addEventListener('message', () => window.__heard++)")
        chatter = threading.Thread(target=other_queue_events, daemon=True)
        chatter.start()
        try:
            jobs.wait_for_function("() => window.__heard >= 3")  # the list hears them
            end(second)
            expect(jobs.locator(f"tr[data-id='{second}'][data-state=succeeded]")).to_have_count(1)
        finally:
            stop.set()
            chatter.join(5)
        for page in (jobs, detail, overview):
            page.close()


def test_behind_a_reverse_proxy_under_a_path_prefix(
    browser: Browser, child_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    env = {**child_env, "POSTBOX_TASKS": "tests.harness.tasks.api", "POSTBOX_API_KEY": KEY}
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO postbox.outbox (queue, task, state) VALUES ('apiq', 'api_echo', 'queued')")
    with api_process(env, tmp_path, "--root-path", "/postbox") as api, PrefixProxy(api.port, "/postbox") as proxy:
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        base = f"http://127.0.0.1:{proxy.port}/postbox/"
        _open(page, base, "overview")
        expect(page.locator("tr[data-queue=apiq]")).to_contain_text("apiq")
        expect(page.locator("#live")).to_have_text("live")  # the WebSocket through the proxy
        _go(page, "#/login", "login")
        page.fill("#key", KEY)
        page.click("form.login button")
        page.wait_for_selector("#logout")
        page.wait_for_selector("body[data-loaded=overview]")  # the landing page after a login
        (cookie,) = context.cookies()
        assert (cookie["name"], cookie["path"]) == ("postbox_session", "/postbox/")
        _go(page, "#/queues", "queues")
        page.click("tr[data-queue=apiq] button")
        page.click("#confirm-ok")
        expect(page.locator("tr[data-queue=apiq] .queue-state")).to_have_text("paused")
        assert page.url == base + "#/queues"
        context.close()


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "app/tasks.py", line 12, in charge\n'
    "    raise PaymentRefused(reply)\n"
    "app.errors.PaymentRefused: <b>card declined</b>"
)


def test_a_failed_attempts_traceback_and_times_labelled_with_their_zone(
    browser: Browser, child_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    """Issue 28: the job page shows each failed attempt's traceback (as text), and every time says its zone."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            """
            INSERT INTO postbox.outbox (queue, task, args, state, attempts, max_attempts, created_at, available_at,
                                        started_at, finished_at, last_error_class, last_error)
            VALUES ('apiq', 'api_sum', '{"a": 1}', 'dead', 1, 1, '2026-12-01 10:00:00+00', '2026-12-01 10:00:00+00',
                    '2026-12-01 10:00:01+00', '2026-12-01 10:00:03.5+00', 'PaymentRefused', '<b>card declined</b>')
            RETURNING id
            """
        ).fetchone()
        assert row is not None
        dead = int(row[0])
        conn.execute(
            """
            INSERT INTO postbox.job_attempts (outbox_id, attempt, worker_id, started_at, finished_at, outcome,
                                              error_class, error, traceback)
            VALUES (%s, 1, 'worker-live0001', '2026-12-01 10:00:01+00', '2026-12-01 10:00:03.5+00', 'dead',
                    'PaymentRefused', '<b>card declined</b>', %s)
            """,
            (dead, TRACEBACK),
        )
        conn.execute(
            """
            INSERT INTO postbox.schedules (name, task, queue, priority, max_attempts, cron, tz, cursor_at, next_run_at)
            VALUES ('nightly-berlin', 'api_echo', 'apiq', 5, 3, '0 3 * * *', 'Europe/Berlin',
                    '2026-12-02 02:00:00+00', '2026-12-03 02:00:00+00')
            """
        )
    env = {**child_env, "POSTBOX_TASKS": "tests.harness.tasks.api", "POSTBOX_API_INSECURE": "true"}
    with api_process(env, tmp_path) as api:
        # A viewer in Berlin: times in Berlin's zone, labelled, and the page says which zone.
        berlin = browser.new_context(timezone_id="Europe/Berlin")
        page = berlin.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        _open(page, f"{api.url}/#/jobs/{dead}", "job")
        expect(page.locator("#zone")).to_have_text("times in Europe/Berlin (CET)")
        tb = page.locator("details.traceback")
        expect(tb).to_have_count(1)
        expect(tb.locator("pre.traceback")).to_be_hidden()  # collapsed until asked for
        tb.locator("summary").click()
        expect(tb.locator("pre.traceback")).to_be_visible()
        # The page is drawn again on this job's events (and when the live socket connects): what the reader
        # opened stays open. The drawn element is marked, an event sent, and the new one looked at.
        page.evaluate("document.querySelector('details.traceback').dataset.drawn = 'before'")
        with redis.Redis.from_url(env["POSTBOX_REDIS_URL"]) as client:

            def redrawn() -> bool:
                evt = events.event("progress", job_id=dead, queue="apiq", task="api_sum", attempt=1)
                client.publish(events_channel(env["POSTBOX_REDIS_PREFIX"]), events.encode(evt))
                return page.locator("details.traceback[data-drawn]").count() == 0

            wait_until(redrawn, TIMEOUT_MS / 1000, interval=0.5, message="the job page drawn again")
        expect(tb.locator("pre.traceback")).to_be_visible()
        expect(tb.locator("pre.traceback")).to_have_text(TRACEBACK)  # as text: the markup is not rendered
        assert tb.locator("pre.traceback b").count() == 0
        attempt = page.locator("table tbody tr").first
        expect(attempt).to_contain_text("2026-12-01 11:00:01 CET")
        expect(attempt).to_contain_text("2.50 s")
        expect(page.locator("#timeline")).to_contain_text("2026-12-01 11:00:03 CET")
        _go(page, "#/schedules", "schedules")
        expect(page.locator("tr[data-schedule=nightly-berlin]")).to_contain_text("2026-12-03 03:00:00 CET")
        berlin.close()

        # A viewer in UTC: the schedule's next run in its own zone, and in the viewer's.
        utc = browser.new_context(timezone_id="UTC")
        page = utc.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        _open(page, f"{api.url}/#/schedules", "schedules")
        expect(page.locator("#zone")).to_have_text("times in UTC")
        schedule = page.locator("tr[data-schedule=nightly-berlin]")
        expect(schedule.locator(".own-zone").first).to_have_text("2026-12-03 03:00:00 CET")
        expect(schedule).to_contain_text("2026-12-03 02:00:00 UTC")
        _go(page, f"#/jobs/{dead}", "job")
        expect(page.locator("table tbody tr").first).to_contain_text("2026-12-01 10:00:01 UTC")
        utc.close()
