"""The dashboard's job page for job control (issue 32) in a real browser against `postbox api run`:
a progress bar (its note withheld before login) refreshed live by the events, Move… (confirmed, audited),
and an encrypted task's args opened after login by an API that has the key.

Skipped like tests/system/test_dashboard.py where chromium or Playwright is missing.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import psycopg
import redis as syncredis

import postbox
from postbox import encryption
from postbox.events import encode, event
from postbox.streams import events_channel
from tests.harness.tasks import job_control as jc
from tests.harness.wait import wait_until
from tests.system import test_dashboard as dash
from tests.system.test_dashboard import KEY, TIMEOUT_MS, _go, _open, api_process

pytestmark = dash.pytestmark  # skipped, with the reason, where chromium or Playwright is missing
browser = dash.browser  # the fixture, used by name

K1 = "k1:" + base64.b64encode(b"\x07" * 32).decode()
CARD = "4000-1234-5678-9010"


def _seed(conn: psycopg.Connection[Any]) -> dict[str, int]:
    def one(query: str) -> int:
        row = conn.execute(query).fetchone()
        assert row is not None
        return int(row[0])

    running = one(
        """
        INSERT INTO postbox.outbox (queue, task, args, state, attempts, started_at, claimed_by, progress)
        VALUES ('apiq', 'api_echo', '{}', 'running', 1, now(), 'worker-live0001',
                jsonb_build_object('done', 42, 'total', 168, 'note', 'rows of alice', 'attempt', 1, 'at', now()))
        RETURNING id
        """
    )
    waiting = one("INSERT INTO postbox.outbox (queue, task, args) VALUES ('apiq', 'api_echo', '{}') RETURNING id")
    encryption.use_keys(K1)
    try:
        secret = int(postbox.enqueue(conn, jc.jc_secret, {"card": CARD, "n": 3}))
    finally:
        encryption.use_keys(None)
    return {"running": running, "waiting": waiting, "secret": secret}


def test_progress_bar_live_move_and_encrypted_args_on_the_job_page(
    browser: Any, child_env: dict[str, str], database_url: str, settings: Any, tmp_path: Path
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        ids = _seed(conn)
        env = {
            **child_env,
            "POSTBOX_TASKS": "tests.harness.tasks.api,tests.harness.tasks.job_control",
            "POSTBOX_API_KEY": KEY,
            "POSTBOX_ENCRYPTION_KEYS": K1,
        }
        with api_process(env, tmp_path) as api:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)

            # Before login: the bar and its numbers, not the handler's note; the sealed args withheld.
            _open(page, f"{api.url}/#/jobs/{ids['running']}", "job")
            bar = page.locator("#job-progress")
            dash.expect(bar).to_have_attribute("max", "168")
            dash.expect(bar).to_have_attribute("value", "42")
            dash.expect(page.locator("#job-progress-text")).to_contain_text("42/168 (25%)")
            dash.expect(page.locator("#job-progress-text")).not_to_contain_text("alice")
            _go(page, f"#/jobs/{ids['secret']}", "job")
            dash.expect(page.locator("main")).not_to_contain_text(CARD)

            _go(page, "#/login", "login")
            page.fill("#key", KEY)
            page.click("form.login button")
            page.wait_for_selector("#logout")
            page.wait_for_selector("body[data-loaded=overview]")  # the landing page after a login

            # Logged in: the note; then a new value, written and announced as a worker does, shows live.
            _go(page, f"#/jobs/{ids['running']}", "job")
            dash.expect(page.locator("#job-progress-text")).to_contain_text("— rows of alice")
            progress = {"done": 84, "total": 168, "note": "half", "attempt": 1}
            conn.execute(
                "UPDATE postbox.outbox SET progress = %s::jsonb || jsonb_build_object('at', now()) WHERE id = %s",
                (orjson.dumps(progress).decode(), ids["running"]),
            )
            redis = syncredis.Redis.from_url(str(settings.redis_url))
            try:
                redis.publish(
                    events_channel(settings.redis_prefix),
                    encode(
                        event(
                            "progress",
                            job_id=ids["running"],
                            queue="apiq",
                            task="api_echo",
                            attempt=1,
                            progress=progress,
                        )
                    ),
                )
            finally:
                redis.close()
            dash.expect(page.locator("#job-progress")).to_have_attribute("value", "84")
            dash.expect(page.locator("#job-progress-text")).to_contain_text("84/168 (50%) — half")

            # Move…: a new priority, confirmed, done through the API, audited.
            _go(page, f"#/jobs/{ids['waiting']}", "job")
            page.fill("#move-priority", "8")
            page.click("#job-move")
            dash.expect(page.locator("#confirm-text")).to_contain_text("priority 5 → 8")
            page.click("#confirm-ok")
            wait_until(
                lambda: (
                    conn.execute("SELECT priority FROM postbox.outbox WHERE id = %s", (ids["waiting"],)).fetchone()
                    == (8,)
                ),
                30,
                message="the move done through the API",
            )
            dash.expect(page.locator("#banner")).to_be_hidden()  # no error shown
            audit = conn.execute("SELECT actor, action FROM postbox.audit_log WHERE action = 'job.move'").fetchall()
            assert len(audit) == 1 and audit[0][0].startswith("session:")

            # The encrypted job: its args opened for the logged-in reader (the API holds k1).
            _go(page, f"#/jobs/{ids['secret']}", "job")
            dash.expect(page.locator("main")).to_contain_text(CARD)
            context.close()
