"""A primary and a replica (real ``redis-server`` processes), and a failover that loses the tail.

The clients are pointed at the primary's port for the whole test. The failover:

1. :meth:`RedisPair.detach_replica` — ``REPLICAOF NO ONE`` on the replica: its data
   stops at this instant while the primary goes on taking writes (the tail the
   replica will never get: stream entries, XACK/XDEL, group state);
2. :meth:`RedisPair.fail_over` — SIGKILL the primary, and serve the replica's
   data on the primary's address: the replica writes a snapshot (``SAVE``), a new
   server on the primary's port starts from it. Clients reconnect to the same
   address and find the replica's data: what a Sentinel or a managed failover
   (a DNS name or proxy moving to the promoted replica) gives them, with the
   last writes gone.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis as syncredis

from tests.harness.redis_server import RedisServer
from tests.harness.wait import wait_until


def replication(client: syncredis.Redis) -> dict[str, object]:
    info: dict[str, object] = client.info("replication")
    return info


def wait_synced(primary: syncredis.Redis, replica: syncredis.Redis, timeout: float = 30.0) -> None:
    """Until the replica's link is up and it has applied everything the primary sent."""

    def synced() -> bool:
        mine = replication(replica)
        return mine.get("master_link_status") == "up" and mine.get("slave_repl_offset") == replication(primary).get(
            "master_repl_offset"
        )

    wait_until(
        synced,
        timeout,
        interval=0.02,
        message="the replica caught up with its primary",
        ignore=(syncredis.ConnectionError,),
    )


class RedisPair:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.primary = RedisServer(workdir / "primary", extra=["--repl-diskless-sync-delay", "0"])
        self.replica = RedisServer(workdir / "replica")
        self.replica.extra = ["--replicaof", "127.0.0.1", str(self.primary.port)]

    @property
    def url(self) -> str:
        """Where the clients connect: the primary's address, before and after the failover."""
        return self.primary.url

    def start(self) -> None:
        self.primary.start()
        self.replica.start()
        self.wait_synced()

    def wait_synced(self) -> None:
        with self.primary.client() as primary, self.replica.client() as replica:
            wait_synced(primary, replica)

    def detach_replica(self) -> None:
        """Stop replication now: the replica keeps what it has; later writes reach the primary only."""
        with self.replica.client() as replica:
            replica.replicaof("NO", "ONE")

    def fail_over(self) -> float:
        """Kill the primary; serve the replica's data on the primary's address. Returns the outage in seconds."""
        started = time.monotonic()
        self.primary.stop()
        with self.replica.client() as replica:
            replica.save()  # the detached replica takes no writes: this is its data at detach time
        shutil.copyfile(self.replica.workdir / "dump.rdb", self.primary.workdir / "dump.rdb")
        self.primary.start()  # loads dump.rdb; refuses connections until then
        return time.monotonic() - started

    def stop(self) -> None:
        self.primary.stop()
        self.replica.stop()


@contextmanager
def redis_pair(workdir: Path) -> Iterator[RedisPair]:
    pair = RedisPair(workdir)
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()


__all__ = ["RedisPair", "redis_pair", "wait_synced"]
