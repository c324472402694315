"""postbox.django's settings bridge and the handler-thread hook, without servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from postbox import hooks
from postbox.django.conf import database_url

PROJECT = Path(__file__).resolve().parents[1] / "django_project"


def test_a_postgresql_databases_entry_becomes_a_libpq_url() -> None:
    entry = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "shop",
        "USER": "app",
        "PASSWORD": "p@ss/word",
        "HOST": "db.internal",
        "PORT": 6432,
        "OPTIONS": {"sslmode": "require", "application_name": "web", "pool": True},
    }
    assert database_url(entry) == "postgresql://app:p%40ss%2Fword@db.internal:6432/shop?sslmode=require"


def test_a_socket_folder_goes_in_the_query_and_other_engines_give_nothing() -> None:
    socket = {"ENGINE": "django.contrib.gis.db.backends.postgis", "NAME": "geo", "HOST": "/var/run/postgresql"}
    assert database_url(socket) == "postgresql:///geo?host=%2Fvar%2Frun%2Fpostgresql"
    assert database_url({"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}) is None


def test_in_handler_thread_hooks_run_on_the_handlers_thread_before_and_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(hooks, "registered", hooks.Hooks())
    hooks.in_handler_thread(lambda: seen.append(("hook", threading.get_ident())))

    def handler() -> int:
        seen.append(("handler", threading.get_ident()))
        raise ValueError("boom")

    wrapped = hooks.on_thread(handler)
    result: list[BaseException] = []

    def run() -> None:
        try:
            wrapped()
        except ValueError as exc:
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert [what for what, _ in seen] == ["hook", "handler", "hook"]
    assert {ident for _, ident in seen} == {thread.ident}
    assert len(result) == 1  # the handler's exception is the caller's, after the hook ran


def settings_in_django(**env: str) -> dict[str, object]:
    code = (
        "import json, django; django.setup(); from postbox.settings import load_settings; s = load_settings(); "
        "print(json.dumps({'db': s.database_url, 'redis': s.redis_url, 'prefix': s.redis_prefix, "
        "'concurrency': s.concurrency, 'tasks': s.tasks}))"
    )
    base = {
        k: v for k, v in os.environ.items() if not k.startswith("POSTBOX_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    base.update(DJANGO_SETTINGS_MODULE="shop.settings", PYTHONPATH=str(PROJECT), ORDERS_DB_NAME="shopdb", **env)
    done = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_django_settings_give_postboxs_below_the_environment() -> None:
    found = settings_in_django(ORDERS_REDIS_PREFIX="shop-x", ORDERS_CONCURRENCY="7")
    assert found == {
        "db": "postgresql://postgres@127.0.0.1:5432/shopdb",
        "redis": "redis://127.0.0.1:6379/0",
        "prefix": "shop-x",
        "concurrency": 7,
        "tasks": ["orders.tasks"],
    }
    found = settings_in_django(
        POSTBOX_DATABASE_URL="postgresql://other/elsewhere", POSTBOX_CONCURRENCY="3", POSTBOX_TASKS="orders.views"
    )
    assert (found["db"], found["concurrency"], found["tasks"]) == ("postgresql://other/elsewhere", 3, ["orders.views"])


def test_an_unknown_key_in_settings_postbox_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "bad_settings.py").write_text("from shop.settings import *  # noqa\nPOSTBOX = {'CONCURENCY': 4}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTBOX_")}
    env.update(DJANGO_SETTINGS_MODULE="bad_settings", PYTHONPATH=f"{PROJECT}:{tmp_path}")
    argv = [sys.executable, "-m", "postbox.app", "worker", "run"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "settings.POSTBOX: unknown setting 'CONCURENCY'" in done.stderr
    assert "Traceback" not in done.stderr
