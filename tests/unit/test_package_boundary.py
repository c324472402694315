"""One import namespace: the folders are `postbox` and its subpackages, and the layers stay apart."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import postbox

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"jobs": "postbox", "relay": "postbox.relay", "worker": "postbox.worker", "app": "postbox.app"}


def test_the_public_api_is_what_the_reference_documents() -> None:
    documented = set(re.findall(r"`([A-Za-z_]+)[`(]", (ROOT / "docs/python-api.md").read_text()))
    exported = set(postbox.__all__)
    assert exported - documented == set(), "exported but not in docs/python-api.md"
    assert {
        "task",
        "enqueue",
        "enqueue_async",
        "enqueue_many",
        "enqueue_many_async",
        "get_result",
        "get_result_async",
        "wait_result",
        "JobContext",
        "JobResult",
        "JobState",
        "RetryLater",
        "PermanentError",
        "PostboxError",
        "Settings",
    } <= exported
    for name in exported:
        assert getattr(postbox, name) is not None


@pytest.mark.parametrize("folder", [*FOLDERS, "migrations"])
def test_no_folder_is_importable_under_its_own_name(folder: str) -> None:
    """From the repository's root (the worst case: the folder is on sys.path), the old name is refused."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {folder}"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "import postbox" in done.stderr and f"not {folder}" in done.stderr


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


LAB = ("postbox_examples", "postbox_bench", "tests")  # beside the product, never imported by it

# Entry points dispatch to every layer, as `postbox` (app/cli.py) does: Django finds the
# `manage.py postbox ...` command only inside the Django app's package (jobs/django/), so
# that one command module may call the `postbox` command it wraps, and nothing else there.
ENTRY_POINTS = {"jobs/django/management/commands/postbox.py": ("postbox.app.cli",)}


def test_dependencies_flow_one_way() -> None:
    """The core imports nothing of relay, worker or app; relay and worker not each other; the product no example,
    benchmark or test."""
    forbidden = {
        "jobs": ("postbox.relay", "postbox.worker", "postbox.app", *LAB),
        "relay": ("postbox.worker", "postbox.app", *LAB),
        "worker": ("postbox.relay", "postbox.app", *LAB),
        "app": LAB,
        "migrations": ("postbox.relay", "postbox.worker", "postbox.app", *LAB),
    }
    offenders = []
    for folder, banned in forbidden.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            allowed = ENTRY_POINTS.get(str(path.relative_to(ROOT)), ())
            offenders += [
                f"{path.relative_to(ROOT)}: {name}"
                for name in _imports(path)
                if name.startswith(banned) and name not in allowed
            ]
    assert offenders == []


def test_every_module_imports_under_its_installed_name() -> None:
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            if rel.name == "__main__":
                continue  # entry points run on import
            parts = [p for p in rel.parts if p != "__init__"]
            module = importlib.import_module(".".join([package, *parts]))
            assert module.__name__.startswith(package)


def test_the_lab_is_outside_the_product() -> None:
    """The benchmarks and the examples are their own folders, installed beside postbox, not inside it."""
    assert not (ROOT / "app" / "bench").exists() and not (ROOT / "app" / "stagedoor").exists()
    import postbox_bench
    import postbox_examples

    assert Path(postbox_bench.__file__).resolve().parent == (ROOT / "bench").resolve()
    assert Path(postbox_examples.__file__).resolve().parent == (ROOT / "examples").resolve()
