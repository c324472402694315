"""Small pure helpers of the bench: URLs of its own database / Redis db, producer lanes, peer names."""

from __future__ import annotations

import gc

import pytest

from postbox_bench.enqueue import slice_plan
from postbox_bench.peers.common import PeerConfig, read_probe_file
from postbox_bench.peers.registry import PEERS, adapter
from postbox_bench.sandbox import redis_db_of, with_database, with_redis_db
from postbox_bench.steady import producers_for, without_gc_pauses
from postbox_bench.tasks import read_probes


def test_urls_of_the_bench_database_and_redis_db() -> None:
    url = "postgresql://u:p@db:5432/app?sslmode=disable"
    assert (
        with_database(url, "postbox_bench_ab12cd34")
        == "postgresql://u:p@db:5432/postbox_bench_ab12cd34?sslmode=disable"
    )
    assert with_redis_db("redis://:pw@cache:6379/0", 14) == "redis://:pw@cache:6379/14"
    assert redis_db_of("redis://cache:6379/3") == 3
    assert redis_db_of("redis://cache:6379") == 0


@pytest.mark.parametrize(("rate", "lanes"), [(1, 2), (200, 2), (500, 4), (1000, 8), (100_000, 16)])
def test_producer_lanes_grow_with_the_rate(rate: int, lanes: int) -> None:
    assert producers_for(rate) == lanes


def test_probe_files_keep_the_first_start_of_each_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "probe.txt"
    path.write_text("7 100.5\n8 101.25\n7 130.0\ngarbage\n")
    assert read_probes(str(path)) == {7: 100.5, 8: 101.25}
    assert read_probe_file(str(path)) == {"7": 100.5, "8": 101.25}
    assert read_probes(str(tmp_path / "missing.txt")) == {}


def test_peer_config_round_trips_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = PeerConfig(database_url="postgresql://h/db", redis_url="redis://h/5", concurrency=12)
    for key, value in cfg.env().items():
        monkeypatch.setenv(key, value)
    assert PeerConfig.from_env() == cfg


def test_unknown_peer_is_refused() -> None:
    assert PEERS == ("pgqueuer", "procrastinate", "arq", "saq")
    with pytest.raises(ValueError, match="unknown peer 'celery'"):
        adapter("celery")


def test_enqueue_slices_alternate_abba_and_give_each_variant_the_whole_duration() -> None:
    length, order = slice_plan(5.0)
    assert length == 0.25 and len(order) == 40
    assert order[:8] == [False, True, True, False, False, True, True, False]
    assert order.count(True) == order.count(False) == 20
    assert slice_plan(0.2) == (0.2, [False, True])  # shorter than a slice: one of each
    length, order = slice_plan(1.1)
    assert (length, order.count(True)) == (1.1 / 4, 4)


def test_the_producer_holds_the_collector_off_while_it_paces_and_restores_it_after() -> None:
    assert gc.isenabled()
    with without_gc_pauses():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with without_gc_pauses():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()
