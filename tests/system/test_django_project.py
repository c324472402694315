"""The sample Django project (tests/django_project/) as a Django team runs it, with ``postbox.django``.

- Its own pytest-django suite passes, on a test database Django creates (postbox's
  schema comes with ``migrate``), and again twice with ``--reuse-db`` (Django's flush
  empties postbox's tables); with the view's enqueue removed it fails, naming the job.
- ``manage.py postbox worker run --processes 2``: both children set Django up and register; the
  project's jobs run; SIGTERM to the supervisor stops all of them cleanly.
- ``postbox worker run`` with only ``DJANGO_SETTINGS_MODULE`` set (the database from
  ``DATABASES``, Redis from ``settings.POSTBOX``, tasks from the installed apps) runs
  ORM jobs; ``manage.py postbox relay run`` publishes them. After the jobs the worker's
  handler threads hold no Django connection (``CONN_MAX_AGE=0``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from postbox.migrate import head_revision
from tests.harness import databases
from tests.harness.servers import Servers
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system

PROJECT = Path(__file__).resolve().parents[1] / "django_project"
DJANGO_APP_NAME = "orders-django"  # the application_name of Django's connections (shop/settings.py)


class Project:
    def __init__(self, env: dict[str, str], admin_url: str, name: str, test_name: str) -> None:
        self.env, self.admin_url, self.name, self.test_name = env, admin_url, name, test_name

    @property
    def url(self) -> str:
        return databases.with_database(self.admin_url, self.name)

    def run(self, *argv: str, timeout: float = 240, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv],
            cwd=PROJECT,
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, *argv],
            cwd=PROJECT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.fixture
def project(servers: Servers, redis_prefix: str) -> Iterator[Project]:
    """The sample project's environment: its own database (created here, dropped after), no POSTBOX_*."""
    admin = urlsplit(servers.database_url)
    name = databases.create(servers.database_url, "dj")
    test_name = databases.new_name("djt")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("POSTBOX_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="shop.settings",
        PYTHONPATH=str(PROJECT),
        PYTHONUNBUFFERED="1",
        ORDERS_DB_NAME=name,
        ORDERS_TEST_DB_NAME=test_name,
        ORDERS_DB_USER=admin.username or "postgres",
        ORDERS_DB_HOST=admin.hostname or "127.0.0.1",
        ORDERS_DB_PORT=str(admin.port or 5432),
        ORDERS_REDIS_URL=servers.redis_url,
        ORDERS_REDIS_PREFIX=redis_prefix,
        ORDERS_CONN_MAX_AGE="0",
    )
    if admin.password:
        env["PGPASSWORD"] = admin.password
    yield Project(env, servers.database_url, name, test_name)
    databases.drop(servers.database_url, test_name)
    databases.drop(servers.database_url, name)


def place_orders(project: Project, count: int, tasks: tuple[str, ...]) -> None:
    """``count`` orders placed by ``manage.py shell``, each enqueuing ``tasks`` in the order's transaction."""
    enqueues = "".join(f"        postbox.enqueue(connection, {task}, {{'order_id': order.pk}})\n" for task in tasks)
    placed = project.run(
        "manage.py",
        "shell",
        "-c",
        "from django.db import connection, transaction\n"
        "import postbox\n"
        "from orders.models import Order\n"
        f"from orders.tasks import {', '.join(tasks)}\n"
        f"for i in range({count}):\n"
        "    with transaction.atomic():\n"
        "        order = Order.objects.create(email=f'c{i}@example.com', total_cents=100 + i)\n" + enqueues,
    )
    assert placed.returncode == 0, placed.stderr


def suite(project: Project, *options: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return project.run("-m", "pytest", "-q", "-p", "no:xdist", *options, **extra)


def test_the_projects_suite_passes_on_its_test_database_and_again_with_reuse_db(project: Project) -> None:
    for options in ((), ("--reuse-db",), ("--reuse-db",)):
        done = suite(project, *options)
        assert done.returncode == 0, f"pytest {' '.join(options)}:\n{done.stdout}\n{done.stderr}"
        assert "3 passed" in done.stdout, done.stdout

    # The kept test database: postbox's schema at head, its tables emptied by the last flush.
    with psycopg.connect(databases.with_database(project.admin_url, project.test_name)) as conn:
        assert conn.execute("SELECT version_num FROM postbox.alembic_version").fetchall() == [(head_revision(),)]
        assert conn.execute("SELECT count(*) FROM postbox.outbox").fetchone() == (0,)


def test_the_projects_suite_fails_when_the_view_enqueues_nothing(project: Project) -> None:
    done = suite(project, ORDERS_SKIP_RECEIPT="1")

    assert done.returncode == 1, done.stdout
    failed = sorted(line.split(" - ")[0] for line in done.stdout.splitlines() if line.startswith("FAILED "))
    assert failed == [
        "FAILED orders/tests/test_orders.py::test_placing_an_order_enqueues_its_receipt",
        "FAILED orders/tests/test_orders.py::test_the_order_and_its_job_commit_together",
    ], done.stdout
    assert "expected 1 job(s) send_receipt" in done.stdout, done.stdout


def terminate(*processes: subprocess.Popen[str]) -> list[str]:
    """SIGTERM to every process at once, then each one's output once it has exited."""
    for process in processes:
        process.send_signal(signal.SIGTERM)
    return [process.communicate(timeout=60)[0] for process in processes]


def django_connections(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            (DJANGO_APP_NAME,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_worker_started_with_only_django_settings_runs_orm_jobs_and_keeps_no_django_connection(
    project: Project,
) -> None:
    migrated = project.run("manage.py", "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying postbox's schema (postbox) to head" in migrated.stdout

    relay = project.start("manage.py", "postbox", "relay", "run")
    worker = project.start("-m", "postbox.app", "worker", "run")  # tasks: the installed apps' tasks modules
    try:
        count = 12
        place_orders(project, count, ("send_receipt", "audit_order"))

        def states() -> dict[str, int]:
            with psycopg.connect(project.url) as conn:
                rows = conn.execute("SELECT state, count(*) FROM postbox.outbox GROUP BY state").fetchall()
            return {state: int(n) for state, n in rows}

        wait_until(lambda: states() == {"succeeded": 2 * count}, timeout=90, message="every job succeeded")
        with psycopg.connect(project.url) as conn:
            receipts = conn.execute("SELECT count(*), count(DISTINCT order_id) FROM orders_receipt").fetchone()
        assert receipts == (count, count)
        # Each sync job's thread closed its Django connection after the job (CONN_MAX_AGE=0):
        # none is left idle (the worker's own pool connections are named postbox-*).
        wait_until(
            lambda: django_connections(project.url) == 0,
            timeout=10,
            message=lambda: f"no Django connection left ({django_connections(project.url)} open)",
        )
        assert worker.poll() is None and relay.poll() is None
    finally:
        outputs = terminate(worker, relay)
    assert worker.returncode == 0, outputs[0]
    assert relay.returncode == 0, outputs[1]


def test_manage_py_postbox_worker_run_with_two_processes_sets_django_up_in_each_and_runs_the_jobs(
    project: Project,
) -> None:
    """``manage.py postbox worker run --processes 2``: the supervisor's children set Django up themselves
    (``DJANGO_SETTINGS_MODULE`` inherited) and take the installed apps' tasks; SIGTERM stops all three."""
    migrated = project.run("manage.py", "migrate", "--no-input")
    assert migrated.returncode == 0, migrated.stderr
    relay = project.start("manage.py", "postbox", "relay", "run")
    supervisor = project.start("manage.py", "postbox", "worker", "run", "--processes", "2")
    try:

        def workers() -> int:
            with psycopg.connect(project.url) as conn:
                row = conn.execute("SELECT count(*) FROM postbox.workers WHERE stopped_at IS NULL").fetchone()
            return int(row[0]) if row else 0

        wait_until(lambda: workers() == 2, timeout=90, message="two worker processes registered")
        count = 8
        place_orders(project, count, ("send_receipt",))

        def succeeded() -> int:
            with psycopg.connect(project.url) as conn:
                row = conn.execute("SELECT count(*) FROM postbox.outbox WHERE state = 'succeeded'").fetchone()
            return int(row[0]) if row else 0

        wait_until(lambda: succeeded() == count, timeout=90, message=f"{count} jobs succeeded")
        with psycopg.connect(project.url) as conn:
            receipts = conn.execute("SELECT count(*), count(DISTINCT order_id) FROM orders_receipt").fetchone()
            attempts = conn.execute("SELECT count(*) FROM postbox.job_attempts").fetchone()
        assert receipts == (count, count) and attempts == (count,)
        assert supervisor.poll() is None and relay.poll() is None
    finally:
        outputs = terminate(supervisor, relay)
    assert supervisor.returncode == 0, outputs[0]
    assert "every worker process has ended; exit status 0" in outputs[0]
    assert relay.returncode == 0, outputs[1]
    with psycopg.connect(project.url) as conn:
        row = conn.execute("SELECT count(*) FROM postbox.workers WHERE stopped_at IS NULL").fetchone()
    assert row == (0,)  # both children drained and marked themselves stopped
