"""postbox as a user gets it: the wheel, in a fresh virtual environment, inside an application.

The sample application has its own ``app`` and ``jobs`` packages, its own
``orders`` table and its own alembic ``alembic_version`` row: the names that
collided with postbox's old layout. The README's snippet is its ``app/tasks.py``,
word for word. Slow (a wheel build and a venv), so one module-scoped build.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import psycopg
import pytest

from tests.harness.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.system


def sh(*argv: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{argv} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    sh(sys.executable, "-m", "build", "--wheel", "--outdir", out, ROOT, timeout=600)
    (built,) = out.glob("postbox-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with nothing but the wheel (and what it depends on)."""
    where = tmp_path_factory.mktemp("venv") / "v"
    sh(sys.executable, "-m", "venv", where)
    sh(where / "bin" / "python", "-m", "pip", "install", "--quiet", wheel, timeout=900)
    return where


def readme_snippet() -> str:
    """The README's first Python block: the application code a new user copies."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "README has no python block"
    return match.group(1)


def test_the_wheel_installs_only_the_postbox_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        top = {line.split(",")[0].split("/")[0] for line in zf.read(record).decode().splitlines() if line}
        entry_points = zf.read(record.replace("RECORD", "entry_points.txt")).decode()
    assert {name for name in top if not name.endswith(".dist-info")} == {"postbox"}
    assert "postbox/py.typed" in names
    assert "postbox/migrations/versions/0001_postbox.py" in names
    dashboard = {f"postbox/app/dashboard/static/{name}" for name in ("index.html", "app.js", "style.css")}
    assert dashboard <= set(names)  # the web dashboard's assets, served by `postbox api run`
    # The product only: no benchmark, peer adapter, example, demo, embedded server or test.
    lab = re.compile(r"bench|peer|pgqueuer|procrastinate|arq|saq|stagedoor|provider|dtq|demo|embedded|examples|tests/")
    assert [n for n in names if lab.search(n)] == []
    assert entry_points.strip().splitlines() == ["[console_scripts]", "postbox = postbox.app.cli:main"]


def test_a_job_enqueued_in_the_applications_transaction_runs(
    venv: Path, tmp_path: Path, empty_database_url: str, redis_url: str, redis_prefix: str
) -> None:
    project = tmp_path / "shop"
    (project / "app").mkdir(parents=True)
    (project / "jobs").mkdir()
    (project / "app" / "__init__.py").write_text("")
    (project / "app" / "tasks.py").write_text(readme_snippet())
    (project / "jobs" / "__init__.py").write_text("def nightly() -> str:\n    return 'the shop jobs'\n")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, total int NOT NULL,"
            " receipt_sent boolean NOT NULL DEFAULT false)"
        )
        conn.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('shop_0042')")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTBOX_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
        DATABASE_URL=empty_database_url,  # the README's snippet and postbox both read it
        REDIS_URL=redis_url,
        POSTBOX_REDIS_PREFIX=redis_prefix,
        POSTBOX_POLL_INTERVAL="0.2",
    )
    python, postbox = venv / "bin" / "python", venv / "bin" / "postbox"
    # The application's own packages win inside its folder, postbox is only `postbox`.
    assert sh(python, "-c", "import jobs; print(jobs.nightly())", cwd=project, env=env).strip() == "the shop jobs"
    assert "postbox" in sh(postbox, "migrate", cwd=project, env=env)
    procs = [
        subprocess.Popen([postbox, "relay", "run"], cwd=project, env=env, stderr=subprocess.PIPE),
        subprocess.Popen(
            [postbox, "worker", "run", "--tasks", "app.tasks"], cwd=project, env=env, stderr=subprocess.PIPE
        ),
    ]
    try:
        place = "from app.tasks import place_order; print(place_order(42))"
        order_id = int(sh(python, "-c", place, cwd=project, env=env).strip())
        with psycopg.connect(empty_database_url, autocommit=True) as conn:

            def receipt_sent() -> bool:
                for proc in procs:
                    assert proc.poll() is None, proc.communicate()[1]
                row = conn.execute(
                    "SELECT o.receipt_sent, j.state FROM orders o, postbox.outbox j WHERE o.id = %s", (order_id,)
                ).fetchone()
                return row == (True, "succeeded")

            wait_until(receipt_sent, 90, interval=0.1, message="the job run and the receipt sent")
            assert conn.execute("SELECT version_num FROM public.alembic_version").fetchall() == [("shop_0042",)]
            public = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
            assert public == {"orders", "alembic_version"}
            assert conn.execute("SELECT count(*), sum(total) FROM orders").fetchone() == (1, 42)
    finally:
        for proc in procs:
            proc.terminate()
        # communicate() reaps each process and closes its stderr pipe
        errors = [proc.communicate(timeout=60)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errors


def test_another_distribution_with_a_top_level_app_package_leaves_postbox_alone(venv: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    (other / "app").mkdir(parents=True)
    (other / "app" / "__init__.py").write_text("")
    (other / "app" / "cli.py").write_text("def main() -> int:\n    return 7\n")
    (other / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "other-app"\nversion = "1.0"\n[tool.setuptools]\npackages = ["app"]\n'
    )
    python, postbox = venv / "bin" / "python", venv / "bin" / "postbox"
    sh(sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", other)
    (other_wheel,) = (tmp_path / "dist").glob("other_app-*.whl")
    sh(python, "-m", "pip", "install", "--quiet", other_wheel)
    assert sh(python, "-c", "import app.cli; print(app.cli.main())", cwd=tmp_path).strip() == "7"
    assert "usage: postbox" in sh(postbox, "--help")
    sh(python, "-m", "pip", "uninstall", "--quiet", "--yes", "other-app")
    assert "usage: postbox" in sh(postbox, "--help")
    sh(python, "-c", "import postbox.app.cli, postbox.relay, postbox.worker, postbox.migrations", cwd=tmp_path)
    missing = subprocess.run([python, "-c", "import app"], cwd=tmp_path, capture_output=True, text=True)
    assert missing.returncode == 1 and "No module named 'app'" in missing.stderr


def test_mypy_sees_postboxs_types_in_the_application(venv: Path, tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "tasks.py").write_text(readme_snippet())
    (tmp_path / "app" / "wrong.py").write_text(
        "import psycopg\n"
        "from postbox import enqueue\n"
        "from app.tasks import send_receipt\n\n"
        "def place(conn: psycopg.Connection) -> int:\n"
        "    send_receipt.options(priority=9, delay=60).enqueue(conn, order_id=1)  # fine\n"
        "    send_receipt.enqueue(conn, order_id='seven')\n"
        "    send_receipt.enqueue(conn, orderid=7)\n"
        "    return enqueue(conn, send_receipt, [1, 2, 3])\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", str(venv / "bin" / "python"), "--no-incremental", "app"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["7", "8", "9"] and errors[0].startswith("app/wrong.py:")
    assert 'Argument "order_id" to "enqueue" of "Task" has incompatible type "str"; expected "int"' in errors[0]
    assert 'Unexpected keyword argument "orderid" for "enqueue" of "Task"' in errors[1]
    assert '"list[int]"' in errors[2] and "Mapping[str, Any]" in errors[2]
