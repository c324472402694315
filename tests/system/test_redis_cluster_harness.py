"""The harness's real Redis Cluster, postbox's key layout on it, and postbox's processes on it.

Three primaries with a replica each on loopback ports (tests/harness/redis_cluster.py),
started once for this module. A queue's ten priority streams hash to one slot
(the ``{queue}`` hash tag), so one queue is always on one node; different queues
spread over the primaries. A replica takes over its primary's slots
(``CLUSTER FAILOVER``). With ``POSTBOX_REDIS_CLUSTER=true`` the relay, workers,
the API and the CLI run on the cluster, through a failover; without it they
refuse a cluster node at start with one line (and the setting on a plain server too).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from postbox.startup import cluster_refusal
from postbox.streams import queue_streams
from tests.harness.ha import Processes, Producer, all_finished, check_invariants, finished_count
from tests.harness.redis_cluster import RedisClusterServers, running_cluster
from tests.harness.redis_server import free_port
from tests.harness.tasks import ha as tasks_ha
from tests.harness.wait import wait_until

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as found:
        yield found


@pytest.mark.timeout(120)
def test_without_the_cluster_setting_relay_worker_and_api_refuse_a_cluster_node_with_one_line(
    cluster: RedisClusterServers, child_env: dict[str, str]
) -> None:
    env = dict(child_env, POSTBOX_REDIS_URL=cluster.url)
    commands = {
        "relay": ["-m", "postbox.relay", "run"],
        "worker": ["-m", "postbox.worker", "run", "--tasks", "tests.harness.tasks.ha", "--queues", "ha"],
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
                f"postbox {name}: POSTBOX_REDIS_URL points at a Redis Cluster node: set POSTBOX_REDIS_CLUSTER=true "
                "to use the cluster (see docs/operations.md, Redis Cluster)"
            )
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def test_a_plain_server_or_an_unreachable_one_is_not_refused_and_the_cluster_setting_on_a_plain_one_is(
    redis_url: str, cluster: RedisClusterServers
) -> None:
    assert cluster_refusal(redis_url) is None
    assert cluster_refusal(f"redis://127.0.0.1:{free_port()}/0") is None  # down: processes start and wait
    assert cluster_refusal(f"redis://127.0.0.1:{free_port()}/0", cluster=True) is None
    assert cluster_refusal(cluster.url, cluster=True) is None
    assert cluster_refusal(redis_url, cluster=True) == (
        "POSTBOX_REDIS_CLUSTER is set but POSTBOX_REDIS_URL is not a Redis Cluster node (cluster_enabled:0)"
    )
    seeds = f"redis://127.0.0.1:{free_port()}/0,{cluster.url}"  # the first is down: the next one answers
    assert cluster_refusal(seeds, cluster=True) is None
    assert cluster_refusal(seeds) == "POSTBOX_REDIS_URL: several URLs need POSTBOX_REDIS_CLUSTER=true"


def api_ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.timeout(240)
def test_relay_workers_api_and_cli_processes_run_on_the_cluster_through_a_failover(
    cluster: RedisClusterServers, database_url: str, child_env: dict[str, str], tmp_path: Path
) -> None:
    """A steady producer; two relays, two workers and the API as processes; the queue's primary fails over."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(tasks_ha.EFFECTS_DDL)
    env = dict(
        child_env,
        POSTBOX_REDIS_URL=cluster.url,
        POSTBOX_REDIS_CLUSTER="true",
        POSTBOX_VISIBILITY_TIMEOUT="3",
        POSTBOX_HEARTBEAT_INTERVAL="0.5",
        POSTBOX_RELAY_SESSION_TIMEOUT="2",
        POSTBOX_DRAIN_TIMEOUT="2",
        POSTBOX_TASKS="tests.harness.tasks.ha",
        POSTBOX_API_INSECURE="true",
    )
    key = queue_streams(env["POSTBOX_REDIS_PREFIX"], tasks_ha.QUEUE)[0]
    port = free_port()
    procs = Processes(env, tmp_path)
    producer = Producer(database_url)
    try:
        procs.relay()
        procs.relay()
        procs.worker()
        procs.worker()
        procs.start("-m", "postbox.app", "api", "run", "--host", "127.0.0.1", "--port", str(port))
        wait_until(lambda: api_ready(port), 60, message="the API ready", ignore=(psycopg.OperationalError,))
        producer.start()
        wait_until(
            lambda: finished_count(database_url) >= 50,
            60,
            message="the first 50 jobs done",
            ignore=(psycopg.OperationalError,),
        )
        with cluster.client() as client:
            owner = int(client.get_node_from_key(key).port)
        replica = cluster.replica_of(owner)
        with replica.client() as node:
            node.execute_command("CLUSTER", "FAILOVER")
        cluster.wait_ok()
        done = finished_count(database_url)
        wait_until(
            lambda: finished_count(database_url) >= done + 50,
            60,
            message="50 more jobs done after the failover",
            ignore=(psycopg.OperationalError,),
        )
        producer.stop()
        wait_until(lambda: all_finished(database_url), 60, message="every job done", ignore=(psycopg.OperationalError,))
        check_invariants(database_url, producer.committed)

        # An acknowledgement the failover lost (sent to the old primary, not yet replicated)
        # leaves a finished job's entry pending: the reclaimer finds it after the visibility
        # timeout and acknowledges it without running it again.
        def streams_clean() -> bool:
            found = httpx.get(f"http://127.0.0.1:{port}/api/v1/queues/{tasks_ha.QUEUE}", timeout=10).json()
            return (found["in_streams"], found["stream_pending"], found["redis_error"]) == (0, 0, None)

        wait_until(
            streams_clean,
            30,
            message="the streams empty (a lost acknowledgement reclaimed)",
            ignore=(psycopg.OperationalError,),
        )
        check_invariants(database_url, producer.committed)  # and nothing ran twice meanwhile
        for argv in (["pause", tasks_ha.QUEUE], ["list", "--json"]):  # paused: listed with no job waiting
            listed = subprocess.run(
                [sys.executable, "-m", "postbox.app", "queues", *argv],
                env=env, capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
        rows = [q for q in json.loads(listed.stdout) if q["queue"] == tasks_ha.QUEUE]
        assert len(rows) == 1, (listed.stdout, listed.stderr)
        [row] = rows
        assert (row["in_streams"], row["stream_pending"], row["redis_error"]) == (0, 0, None), row
        assert all(code is None for code in procs.exit_codes()), procs.tail()
        assert "Traceback" not in procs.text("worker") + procs.text("relay"), procs.tail()
    finally:
        producer.stop()
        procs.close()


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

        wait_until(promoted, 30, message="the replica owning the queue's slot", ignore=(psycopg.OperationalError,))
        assert client.xlen(key) == 1
