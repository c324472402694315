"""``settle_collector``: what a started relay, worker or API process does to CPython's collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from postbox.startup import settle_collector


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector as it was, back after the test (frozen objects returned to the oldest generation)."""
    threshold = gc.get_threshold()
    frozen = gc.get_freeze_count()
    yield
    gc.set_threshold(*threshold)
    if frozen == 0:
        gc.unfreeze()


@pytest.mark.usefixtures("collector")
def test_the_start_is_frozen_and_young_collections_come_later() -> None:
    gc.set_threshold(700, 10, 10)
    settle_collector(10_000)
    assert gc.get_threshold() == (10_000, 10, 10)
    assert gc.get_freeze_count() > 0


@pytest.mark.usefixtures("collector")
def test_zero_leaves_the_collector_alone() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    settle_collector(0)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector")
def test_the_middle_and_old_thresholds_are_kept() -> None:
    gc.set_threshold(700, 5, 20)
    settle_collector(2_000)
    assert gc.get_threshold() == (2_000, 5, 20)
