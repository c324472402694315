"""Peer drains are timed by an in-memory tally in the peer's worker; configurations are chosen by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from postbox_bench.cli import main
from postbox_bench.peers import parse_peer_configs
from postbox_bench.peers.common import PeerConfig, Tally, read_tally, variant_of
from postbox_bench.peers.pgqueuer_peer import shape


def test_a_tally_file_gives_the_span_from_the_first_handler_run_to_the_last(tmp_path: Path) -> None:
    path = tmp_path / "tally.txt"
    assert read_tally(str(path)).count == 0  # no file yet: nothing ran
    tally = Tally(str(path), interval=3600)  # the thread stays asleep: the test writes itself
    for stamp in (100.0, 100.5, 101.0, 102.0):
        tally.add(stamp)
    tally.write()
    span = read_tally(str(path))
    assert (span.seconds, span.count, span.first) == (2.0, 4, 1)
    assert span.rate == 1.5  # 3 jobs after the first in 2 s
    assert not (tmp_path / "tally.txt.tmp").exists()


def test_configurations_are_named_and_a_bad_name_is_refused() -> None:
    assert shape(PeerConfig()) == (1, 50)  # PgQueuer's best: one manager, batch = concurrency
    assert shape(PeerConfig(variant="5x10")) == (5, 10)
    assert shape(PeerConfig(variant="3x16")) == (3, 16)
    with pytest.raises(ValueError, match="unknown configuration '0x5'"):
        shape(PeerConfig(variant="0x5"))
    assert variant_of(PeerConfig(variant="c10"), {"c10": 10, "c50": 50}, "c50") == 10
    assert variant_of(PeerConfig(), {"c10": 10, "c50": 50}, "c50") == 50
    with pytest.raises(ValueError, match="unknown configuration 'c7'"):
        variant_of(PeerConfig(variant="c7"), {"c10": 10}, "c10")


def test_peer_config_options_are_parsed_and_checked() -> None:
    assert parse_peer_configs(["pgqueuer=2x25", "saq=c100"]) == {"pgqueuer": "2x25", "saq": "c100"}
    with pytest.raises(ValueError, match="expected PEER=CONFIG"):
        parse_peer_configs(["pgqueuer"])
    with pytest.raises(ValueError, match="unknown configuration '5by10'"):
        parse_peer_configs(["pgqueuer=5by10"])
    with pytest.raises(ValueError, match="unknown configuration 'c7' for arq"):
        parse_peer_configs(["arq=c7"])
    with pytest.raises(ValueError, match="unknown peer 'celery'"):
        parse_peer_configs(["celery=x"])


def test_peer_only_names_known_peers_and_needs_peers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--peers", "--peer-only", "celery"]) == 2
    assert "--peer-only: unknown peer 'celery'; one of pgqueuer, procrastinate, arq, saq" in capsys.readouterr().err
    assert main(["worker", "--peer-only", "pgqueuer"]) == 2
    assert "--peer-only needs --peers" in capsys.readouterr().err
