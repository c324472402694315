"""A workflow's declaration as jobs and edges (postbox.workflow.plan): pure, no servers.

Chains link every last job of a step to every first job of the next; groups
run side by side; a chord is a group then its callback; nesting composes. A
job with more than 16 upstream jobs counts them in 16 shards. Bad declarations
are typed errors that name the problem; mypy checks ``task.s(...)`` as it
checks ``task.enqueue(...)``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from postbox.errors import InvalidArgsError, InvalidOptionError
from postbox.registry import Registry, task
from postbox.unique import Unique
from postbox.workflow import SHARDS, WorkflowError, chain, chord, group, plan, prepare_workflow, shard_count

ROOT = Path(__file__).resolve().parents[2]
registry = Registry()


@task(registry=registry)
def fetch(ctx: object, url: str) -> str:
    return url


@task(registry=registry)
def resize(ctx: object, size: int) -> int:
    return size


@task(registry=registry)
def publish(ctx: object) -> None:
    return None


@task(registry=registry, unique=Unique(period=60))
def once(ctx: object) -> None:
    return None


def edges(canvas: object, on_failure: str = "cancel") -> list[tuple[int, int, str]]:
    return sorted((e.parent, e.child, e.on_failure) for e in plan(canvas, on_failure).edges)  # type: ignore[arg-type]


def test_a_chain_links_each_step_to_the_next() -> None:
    flow = chain(fetch.s(url="a"), resize.s(size=1), publish.s())
    assert [s.task for s in plan(flow).jobs] == ["fetch", "resize", "publish"]
    assert edges(flow) == [(0, 1, "cancel"), (1, 2, "cancel")]


def test_a_group_has_no_edges_and_a_chord_joins_it() -> None:
    assert edges(group(resize.s(size=i) for i in range(3))) == []
    flow = chord(group(resize.s(size=i) for i in range(3)), publish.s())
    assert edges(flow) == [(0, 3, "cancel"), (1, 3, "cancel"), (2, 3, "cancel")]
    assert edges(group(resize.s(size=i) for i in range(3)) | publish.s()) == edges(flow)


def test_nesting_fans_out_then_in() -> None:
    flow = chain(fetch.s(url="u"), group(chain(resize.s(size=1), resize.s(size=2)), resize.s(size=3)), publish.s())
    # fetch -> (resize1 -> resize2), fetch -> resize3; resize2 and resize3 -> publish
    assert edges(flow) == [(0, 1, "cancel"), (0, 3, "cancel"), (1, 2, "cancel"), (2, 4, "cancel"), (3, 4, "cancel")]
    assert plan(flow).waiting_on() == [None, 1, 1, 1, 2]


def test_the_policy_is_the_jobs_else_the_workflows() -> None:
    flow = chain(fetch.s(url="u"), resize.s(size=1).on_upstream_failure("record"), publish.s())
    assert edges(flow, "run") == [(0, 1, "record"), (1, 2, "run")]
    with pytest.raises(InvalidOptionError, match="on_failure must be one of cancel, run, record"):
        publish.s().on_upstream_failure("ignore")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError):
        plan(publish.s(), "never")  # type: ignore[arg-type]


def test_a_wide_join_counts_in_sixteen_shards_a_narrow_one_on_its_row() -> None:
    wide = plan(group(resize.s(size=i) for i in range(40)) | publish.s())
    assert wide.waiting_on()[-1] == SHARDS
    shards = wide.shards()
    assert sorted({s for s in shards if s is not None}) == list(range(SHARDS))
    assert max(shards.count(s) for s in range(SHARDS)) - min(shards.count(s) for s in range(SHARDS)) <= 1
    narrow = plan(group(resize.s(size=i) for i in range(SHARDS)) | publish.s())
    assert narrow.shards() == [None] * SHARDS and narrow.waiting_on()[-1] == SHARDS
    assert [shard_count(n) for n in (1, 16, 17, 10_000)] == [0, 0, 16, 16]
    huge = plan(group(resize.s(size=i) for i in range(1000)) | publish.s())
    assert huge.waiting_on()[-1] == 16 and sorted(set(huge.shards())) == list(range(16))


def test_bad_declarations_are_typed_errors_naming_the_problem() -> None:
    with pytest.raises(WorkflowError, match="at least one step"):
        chain()
    with pytest.raises(WorkflowError, match="at least one member"):
        group([])
    with pytest.raises(WorkflowError, match="must be a signature"):
        chain(publish.s(), "publish")  # type: ignore[arg-type]
    same = publish.s()
    with pytest.raises(WorkflowError, match="appears twice"):
        plan(chain(same, same))
    with pytest.raises(InvalidArgsError, match=r"job 1 of the workflow \(resize\)"):
        prepare_workflow(chain(publish.s(), resize.s(size="big")), registry=registry)  # type: ignore[arg-type]
    with pytest.raises(WorkflowError, match="never deduplicated"):
        prepare_workflow(chain(publish.s(), fetch.s(url="u").set(dedup_key="k")), registry=registry)
    with pytest.raises(WorkflowError, match="never deduplicated"):
        prepare_workflow(once.s(), registry=registry)
    with pytest.raises(WorkflowError, match="name"):
        prepare_workflow(publish.s(), name="", registry=registry)


def test_a_group_between_two_wide_groups_is_refused_past_the_edge_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import postbox.workflow as module

    monkeypatch.setattr(module, "MAX_EDGES", 100)
    with pytest.raises(WorkflowError, match="at most 100 dependencies"):
        plan(chain(group(publish.s() for _ in range(11)), group(publish.s() for _ in range(10))))


SNIPPET = """\
from postbox import task
from postbox.workflow import chain


@task()
def resize(ctx: object, size: int) -> int:
    return size


chain(resize.s(size=1), resize.s(size=2))  # fine
resize.s(size="big")
resize.s(width=1)
resize.s()
"""


def test_mypy_checks_a_signatures_arguments_against_the_handler(tmp_path: Path) -> None:
    checked = tmp_path / "flow.py"
    checked.write_text(SNIPPET)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(checked)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = sorted({int(line.split(":")[1]) for line in done.stdout.splitlines() if ": error:" in line})
    assert lines == [11, 12, 13], done.stdout
