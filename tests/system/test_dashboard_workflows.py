"""The dashboard's workflow pages in a real browser, live while a relay and a worker run the workflow.

Headless Debian chromium driven by Playwright (skipped, saying why, where either
is missing, as tests/system/test_dashboard.py is). ``POSTBOX_DASHBOARD_SHOTS=<dir>``
saves screenshots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

import postbox
from postbox.workflow import chain, group
from tests.harness.fleet import child as process
from tests.harness.tasks import workflow as w
from tests.system import test_dashboard as dashboard
from tests.system.test_dashboard import TIMEOUT_MS, _go, _open, _shot, api_process, browser

# The same marks as test_dashboard's: skipped there (chromium or Playwright missing), skipped here.
pytestmark = dashboard.pytestmark if isinstance(dashboard.pytestmark, list) else [dashboard.pytestmark]
__all__ = ["browser"]  # the fixture, shared with test_dashboard


def test_a_workflows_jobs_and_edges_update_live_as_it_runs(
    browser: Any, child_env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(w.LOG_DDL)
    with psycopg.connect(database_url) as conn:
        ids = postbox.enqueue_workflow(
            conn,
            chain(
                w.wf_slow.s(label="fetch", seconds=1.5),
                # one slow branch: the fan-in's progress is seen half done (docs/dashboard/workflow.png)
                group(
                    w.wf_step.s(label="resize0"), w.wf_slow.s(label="resize1", seconds=6), w.wf_step.s(label="resize2")
                ),
                w.wf_collect.s(label="publish"),
            ),
            name="album-7",
        )
        conn.commit()
    env = {**child_env, "POSTBOX_TASKS": "tests.harness.tasks.workflow", "POSTBOX_API_INSECURE": "true"}
    with api_process(env, tmp_path) as api:
        page = browser.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        _open(page, f"{api.url}/#/workflows", "workflows")
        expect(page.locator(f"tr[data-workflow='{ids.id}']")).to_contain_text("album-7")
        expect(page.locator(f"tr[data-workflow='{ids.id}']")).to_contain_text("running")
        _go(page, f"#/workflows/{ids.id}", "workflow")
        expect(page.locator("section.layer")).to_have_count(3)
        fetch, *resizes, publish = ids.jobs
        expect(page.locator(f"tr[data-job='{publish}']")).to_contain_text("waiting")
        expect(page.locator(f"tr[data-job='{resizes[0]}']")).to_contain_text(str(fetch))  # its upstream job
        worker_argv = ["-m", "postbox.worker", "run", "--tasks", "tests.harness.tasks.workflow", "--queues", w.QUEUE]
        with (
            process(["-m", "postbox.relay", "run"], env, tmp_path / "relay.log"),
            process(worker_argv, env, tmp_path / "worker.log"),
        ):
            # no reload: the page follows the events feed
            expect(page.locator(f"tr[data-job='{fetch}']")).to_have_attribute("data-state", "running")
            _shot(page, "workflow-running")
            expect(page.locator(f"tr[data-job='{resizes[0]}']")).to_have_attribute("data-state", "succeeded")
            expect(page.locator(f"tr[data-job='{resizes[2]}']")).to_have_attribute("data-state", "succeeded")
            expect(page.locator(f"tr[data-job='{resizes[1]}']")).to_have_attribute("data-state", "running")
            expect(page.locator(f"tr[data-job='{publish}']")).to_have_attribute("data-state", "waiting")
            _shot(page, "workflow")  # docs/dashboard/workflow.png: 3 of 5 ended, the fan-in waiting
            expect(page.locator(f"tr[data-job='{publish}']")).to_have_attribute("data-state", "succeeded")
            expect(page.locator("main p").first).to_contain_text("succeeded")
            expect(page.locator("main p").first).to_contain_text("5 of 5 jobs ended")
            _shot(page, "workflow-succeeded")
