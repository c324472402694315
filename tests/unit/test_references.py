"""Docstrings, comments and docs name modules that import and files that exist.

The folders are installed under other names (jobs/ is the package `postbox`, relay/ is
`postbox.relay`...), so a reference can be right by one name and wrong by the other: a module
is named by its import name (`postbox.relay.leader`) and a file by its repository path
(`relay/leader.py`). This test reads every docstring, comment and page and checks both.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The repository's source folders and the import name of each (pyproject.toml's package-dir, and
# examples/ and bench/ own pyproject.toml files).
PACKAGES = {
    "jobs": "postbox",
    "relay": "postbox.relay",
    "worker": "postbox.worker",
    "app": "postbox.app",
    "migrations": "postbox.migrations",
    "examples": "postbox_examples",
    "bench": "postbox_bench",
}
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# docs/changelog.md records the past: it names modules and files as they were when the entry
# was written (the folder-named modules before the one `postbox` namespace, files since moved).
# Its names are history, not directions, so only its links are checked.
HISTORY = {ROOT / "docs/changelog.md"}

ROLE = re.compile(r":(?:mod|func|class|meth|attr|exc|data|obj):`~?([^`<>]+?)(?:\(\))?`")
# A dotted import name alone in backticks: `postbox.relay.leader`, `postbox_examples.dtq.tasks`.
# A folder's name used as a module (`relay.leader`) is one too, so that it fails. (`app.state...`
# is FastAPI's application state, not the folder app/.)
DOTTED = re.compile(
    r"`~?((?:postbox|postbox_examples|postbox_bench|jobs|relay|worker|migrations)(?:\.[A-Za-z_]\w*)+)(?:\(\))?`"
)
# A repository path: in backticks, in a markdown link, or in prose with a file suffix. The
# folder `postbox/` does not exist (it is jobs/), so a path under it is always a mistake.
TOP = r"(?:jobs|relay|worker|app|migrations|examples|bench|tests|docs|postbox)"
TICKED_PATH = re.compile(rf"`({TOP}/[\w./-]*)`")
PROSE_PATH = re.compile(rf"(?<![\w./~-])({TOP}/[\w/.-]*\w\.(?:py|md|sql|html|js|css|toml|yml|ini|mako))\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")

# `postbox.outbox`, `postbox.tasks.unique_rule`, `postbox.enqueue(...)` in SQL: a table, column or
# function of the database schema `postbox`, or a transaction-local setting (`set_config('postbox.…')`),
# not a module. They are what the migrations create and set.
_SQL_SOURCES = [*(ROOT / "migrations/versions").glob("*.py"), ROOT / "jobs/sql.py"]
TABLES = {
    match
    for path in _SQL_SOURCES
    for pattern in (
        r"CREATE (?:OR REPLACE )?(?:TABLE|FUNCTION|VIEW) \{schema\}\.(\w+)",
        r"(?:set_config|current_setting)\('postbox\.(\w+)'",
    )
    for match in re.findall(pattern, path.read_text())
}
# Logger names documented for filtering (docs/operations.md, "Logging"): not modules.
LOGGERS = {"postbox.job"}
# docs/benchmarks.md's measurement log is dated: an entry names a file where it was on that day.
THEN = {("docs/benchmarks.md", "relay/resp.py")}


def _sources() -> list[Path]:
    files: list[Path] = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if not any(part in {"build", "__pycache__"} or part.endswith(".egg-info") for part in path.parts):
                files.append(path)
    return files


def _module_of(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = [PACKAGES[relative.parts[0]], *relative.parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import(name: str) -> ModuleType | None:
    if name.split(".")[0] in PACKAGES:
        return None  # a folder's name, importable only when the repository root is on sys.path
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _has(owner: object, attribute: str) -> bool:
    if hasattr(owner, attribute) or attribute in getattr(owner, "__annotations__", {}):
        return True
    # An attribute a class's instances set in __init__ (`self.waiting_on = ""`).
    if isinstance(owner, type):
        try:
            return re.search(rf"self\.{attribute}\s*[:=]", inspect.getsource(owner)) is not None
        except (OSError, TypeError):
            return False
    return False


def _is_sql(target: str) -> bool:
    parts = target.split(".")
    return parts[0] == "postbox" and len(parts) in (2, 3) and parts[1] in TABLES


def _resolves(target: str) -> bool:
    """Whether `target` is a module, or an attribute path under one (`postbox.fence.JobFence.check`)."""
    if _is_sql(target) or target in LOGGERS:
        return True
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        found: object = _import(".".join(parts[:cut]))
        if found is None:
            continue
        for attribute in parts[cut:]:
            if not _has(found, attribute):
                return False
            found = getattr(found, attribute, None)
        return True
    return False


def _resolves_in(target: str, module: str, package: str) -> bool:
    """Sphinx's lookup from a docstring: absolute, then in the current module, then in one of its classes.

    A leading dot is relative to the module's package (`:mod:`.views`` in app/dashboard/__init__.py).
    The scan does not track which class a docstring sits in, so a bare `:meth:`stop`` is accepted
    when some class of the module has it.
    """
    if target.startswith("."):
        return _resolves(importlib.util.resolve_name(target, package))
    if target.split(".")[0] in PACKAGES:
        return False  # a folder's name (`relay.leader`), never an import name
    if "." in target and _resolves(target):
        return True
    if _resolves(f"{module}.{target}") or _resolves(f"builtins.{target}"):
        return True
    namespace = _import(module)
    if namespace is None:
        return False
    head = target.split(".")[0]
    return any(
        isinstance(value, type) and value.__module__ == module and _has(value, head)
        for value in vars(namespace).values()
    )


def _names(text: str) -> set[str]:
    # `relay.py`: a file's name, not a module.
    return {name for name in set(ROLE.findall(text)) | set(DOTTED.findall(text)) if not name.endswith(".py")}


def _paths(text: str) -> set[str]:
    return set(TICKED_PATH.findall(text)) | set(PROSE_PATH.findall(text))


def _exists(path: str) -> bool:
    # `relay/…` and `tests/*_support.py` name a folder's contents; globs name at least one file.
    path = path.rstrip(".").removesuffix("…")
    if any(mark in path for mark in "*?["):
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def test_the_scan_finds_what_it_checks() -> None:
    # A scan that finds nothing passes vacuously: it must see the references the code is full of.
    sources = _sources()
    assert len(sources) > 200
    names = set().union(*(_names(path.read_text()) for path in sources))
    assert {"postbox.errors.SchemaOutdatedError", ".views", "Worker.stop"} <= names
    assert "jobs/resp.py" in set().union(*(_paths(path.read_text()) for path in sources))
    assert not _resolves("jobs.ids") and not _resolves("relay.leader") and _resolves("postbox.ids")
    assert not _exists("postbox/unique.py") and _exists("jobs/unique.py") and _exists("relay/")


def test_module_references_import() -> None:
    wrong = []
    for path in _sources():
        module = _module_of(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for target in sorted(_names(path.read_text())):
            if not _resolves_in(target, module, package):
                wrong.append(f"{path.relative_to(ROOT)}: {target}")
    for page in PAGES:
        if page in HISTORY:
            continue
        wrong += [
            f"{page.relative_to(ROOT)}: {target}"
            for target in sorted(_names(page.read_text()))
            if not _resolves(target)
        ]
    assert wrong == [], "names nothing can import (name a module by its import name, postbox.…)"


def test_repository_paths_exist() -> None:
    wrong = []
    for path in [*_sources(), *(page for page in PAGES if page not in HISTORY)]:
        where = str(path.relative_to(ROOT))
        wrong += [
            f"{where}: {name}"
            for name in sorted(_paths(path.read_text()))
            if not _exists(name) and (where, name) not in THEN
        ]
    assert wrong == [], "not a file or folder of the repository (name a file by its path, jobs/… for postbox)"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_page_links_resolve(page: Path) -> None:
    wrong = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file = target.split("#")[0]
        if not (page.parent / file).exists():
            wrong.append(target)
    assert wrong == []


def _runnable(module: str) -> bool:
    if module.split(".")[0] in PACKAGES:
        return False
    try:
        spec = importlib.util.find_spec(module)
    except ImportError:
        return False
    if spec is None:
        return False
    return spec.submodule_search_locations is None or importlib.util.find_spec(f"{module}.__main__") is not None


def test_python_dash_m_names_a_runnable_module() -> None:
    # relay/__init__.py once advertised `python -m relay run`: relay/ is importable only as postbox.relay.
    wrong = []
    for path in [*_sources(), *(page for page in PAGES if page not in HISTORY)]:
        for module in sorted(set(re.findall(r"python -m\s+([A-Za-z_][\w.]*\w)", path.read_text()))):
            if not _runnable(module):
                wrong.append(f"{path.relative_to(ROOT)}: python -m {module}")
    assert wrong == []


def test_modules_log_under_their_import_name() -> None:
    # A level or filter set on `postbox.relay` covers the relay's modules only if each logs under
    # its own name. `postbox.job` (handlers' logs, worker/context.py) is a documented public name.
    named = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in _sources()
        for name in re.findall(r"getLogger\(\"([^\"]*)\"\)", path.read_text())
    }
    assert named == {"worker/context.py: postbox.job"}
    assert "`postbox.job`" in (ROOT / "docs/operations.md").read_text()
