"""The harness's real Redis Cluster, and what postbox's key layout gives on it.

Three primaries with a replica each on loopback ports (tests/harness/redis_cluster.py).
A queue's ten priority streams hash to one slot (the ``{queue}`` tag), so one
queue is always on one node; different queues spread over the primaries.
A replica takes over its primary's slots (``CLUSTER FAILOVER``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from postbox.streams import queue_streams
from tests.ha_support import wait_for
from tests.harness.redis_cluster import running_cluster

pytestmark = pytest.mark.system


@pytest.mark.timeout(120)
def test_a_queue_lives_on_one_slot_queues_spread_over_three_primaries_and_a_replica_takes_over(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path / "cluster") as cluster:
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
