"""The harness's real Redis Cluster, what postbox's key layout gives on it, and the refusal to run on it.

Three primaries with a replica each on loopback ports (tests/harness/redis_cluster.py),
started once for this module. A queue's ten priority streams hash to one slot
(the ``{queue}`` tag), so one queue is always on one node; different queues
spread over the primaries. A replica takes over its primary's slots
(``CLUSTER FAILOVER``). postbox's processes do not run on a cluster yet: they
refuse it at start with one line, instead of failing queue by queue mid-run.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from postbox.startup import cluster_refusal
from postbox.streams import queue_streams
from tests.ha_support import wait_for
from tests.harness.redis_cluster import RedisClusterServers, running_cluster
from tests.harness.redis_server import free_port

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as found:
        yield found


@pytest.mark.timeout(120)
def test_relay_worker_and_api_refuse_a_cluster_at_start_with_one_line(
    cluster: RedisClusterServers, child_env: dict[str, str]
) -> None:
    env = dict(child_env, POSTBOX_REDIS_URL=cluster.url)
    commands = {
        "relay": ["-m", "postbox.relay", "run"],
        "worker": ["-m", "postbox.worker", "run", "--tasks", "tests.tasks_ha", "--queues", "ha"],
        "api": ["-m", "postbox.app", "api", "run", "--port", str(free_port())],
    }
    procs = {
        name: subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for name, argv in commands.items()
    }
    try:
        for name, proc in procs.items():
            _out, err = proc.communicate(timeout=60)
            assert proc.returncode == 2, (name, err.decode())
            assert err.decode().strip().splitlines()[-1] == (
                f"postbox {name}: POSTBOX_REDIS_URL points at a Redis Cluster node; Redis Cluster is not supported "
                "yet (use one Redis server with replicas; see docs/operations.md)"
            )
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def test_a_plain_server_or_an_unreachable_one_is_not_refused(redis_url: str) -> None:
    assert cluster_refusal(redis_url) is None
    assert cluster_refusal(f"redis://127.0.0.1:{free_port()}/0") is None  # down: processes start and wait


@pytest.mark.timeout(120)
def test_a_queue_lives_on_one_slot_queues_spread_over_three_primaries_and_a_replica_takes_over(
    cluster: RedisClusterServers,
) -> None:
    primaries = cluster.primaries()
    assert len(primaries) == 3
    with cluster.client() as client:
        slots = {queue: {client.keyslot(key) for key in queue_streams("pbx", queue)} for queue in "abc"}
        assert all(len(found) == 1 for found in slots.values()), slots
        nodes = {client.get_node_from_key(queue_streams("pbx", q)[0]).port for q in "abc"}
        assert len(nodes) == 3  # "a", "b" and "c" happen to hash to three different primaries
        key = queue_streams("pbx", "a")[0]
        client.xadd(key, {"id": "1"})
        owner = int(client.get_node_from_key(key).port)
    replica = cluster.replica_of(owner)
    with replica.client() as node:
        node.execute_command("CLUSTER", "FAILOVER")  # a manual failover: the replica waits for every write
    cluster.wait_ok()
    with cluster.client() as client:

        def promoted() -> bool:
            client.nodes_manager.initialize()  # read the slot map again
            return int(client.get_node_from_key(key).port) == int(replica.port)

        wait_for(promoted, 30, "the replica owning the queue's slot")
        assert client.xlen(key) == 1
