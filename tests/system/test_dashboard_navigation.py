"""The dashboard when a reader moves on before a page's answer came, in a real browser against `postbox api run`.

A page's fetch held back (Playwright holds the request, the API answers it once let go) finishes after the
next page has loaded: it must neither mark the body as its own page loaded nor draw over the page shown.
Skipped like tests/system/test_dashboard.py where chromium or Playwright is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from tests.harness.wait import wait_until
from tests.system import test_dashboard as dash
from tests.system.test_dashboard import TIMEOUT_MS, _go, _open, api_process

pytestmark = dash.pytestmark  # skipped, with the reason, where chromium or Playwright is missing
browser = dash.browser  # the fixture, used by name


def test_a_late_answer_for_a_page_left_behind_neither_marks_nor_draws_over_the_next(
    browser: Any, child_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        first, second = (
            int(row[0])
            for row in conn.execute(
                "INSERT INTO postbox.outbox (queue, task, args) VALUES ('apiq', 'api_echo', '{}'), "
                "('apiq', 'api_echo', '{}') RETURNING id"
            ).fetchall()
        )
    env = {**child_env, "POSTBOX_TASKS": "tests.harness.tasks.api"}
    with api_process(env, tmp_path) as api:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        _open(page, f"{api.url}/#/queues", "queues")

        # A page may ask more than once (the live socket's refresh on connecting, an event): hold every
        # request for the two pages, and wait for each page's by its address, not by a count.
        held: list[Any] = []

        def hold(route: Any) -> None:
            held.append(route)

        page.route("**/api/v1/dashboard/overview", hold)
        page.route(f"**/api/v1/dashboard/jobs/{first}", hold)

        def holding(path: str) -> bool:
            page.evaluate("0")  # lets Playwright hand the test its route events
            return any(route.request.url.endswith(path) for route in held)

        # The overview, then the first job, each left while its answer is held; the second job loads.
        page.evaluate("() => { window.location.hash = '#/' }")
        wait_until(lambda: holding("/api/v1/dashboard/overview"), 30, message="the overview's request held")
        page.evaluate(f"() => {{ window.location.hash = '#/jobs/{first}' }}")
        wait_until(lambda: holding(f"/api/v1/dashboard/jobs/{first}"), 30, message="the first job's request held")
        _go(page, f"#/jobs/{second}", "job")
        dash.expect(page.locator("main h1")).to_contain_text(f"Job {second}")
        settled = int(page.evaluate("() => document.body.dataset.settled"))

        # Let the held answers through (the first job's, then the overview's): both pages' loads end, and
        # change nothing the reader sees. Read at once, not retried: a later redraw must not hide a wrong one.
        for route in reversed(list(held)):
            route.continue_()
        page.wait_for_selector(f"body[data-settled='{settled + 2}']")
        shown = page.evaluate(
            "() => [document.body.dataset.loaded, [...document.querySelectorAll('main h1')].map(e => e.textContent)]"
        )
        assert shown[0] == "job"
        assert len(shown[1]) == 1 and shown[1][0].startswith(f"Job {second} "), shown
        context.close()
