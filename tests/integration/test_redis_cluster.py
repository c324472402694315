"""The relay, a worker, the API and the CLI on a real Redis Cluster (POSTBOX_REDIS_CLUSTER).

Three primaries with a replica each (tests/harness/redis_cluster.py), started
once for this module. The test queues are chosen so that their streams live on
three different primaries; the epoch key lives on one of them. Effects are
written in ``ctx.transaction()`` (``worker_effects``), so "ran once" is exact.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import redis as syncredis
from redis.cluster import ClusterNode
from redis.cluster import RedisCluster as SyncCluster

from postbox import redis_conn, resp
from postbox.app.admin import queues_cli
from postbox.relay import Relay, RelaySignals
from postbox.settings import Settings
from postbox.streams import epoch_key, events_channel, queue_streams
from tests.harness.api import make_client
from tests.harness.redis_cluster import RedisClusterServers, running_cluster
from tests.harness.tasks import worker as t
from tests.harness.wait import wait_until_async
from tests.harness.worker import enqueue, fetch, running_worker, worker_settings


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as found:
        yield found


def queues_on_three_primaries(cluster: RedisClusterServers, prefix: str) -> list[str]:
    """Three queue names whose streams hash to three different primaries (first candidates per node)."""
    chosen: dict[int, str] = {}
    with cluster.client() as client:
        for n in range(200):
            name = f"cl{n}"
            port = int(client.get_node_from_key(queue_streams(prefix, name)[0]).port)
            chosen.setdefault(port, name)
            if len(chosen) == 3:
                return list(chosen.values())
    raise AssertionError("no three queues on three primaries")


def node_of(cluster: RedisClusterServers, key: str) -> int:
    """The port of the primary owning ``key`` now, as the live nodes see it (the seed node may be down)."""
    live = [ClusterNode("127.0.0.1", node.port) for node in cluster.nodes if node.proc is not None]
    with SyncCluster(startup_nodes=live) as client:
        return int(client.get_node_from_key(key).port)


@pytest.fixture
def csettings(settings: Settings, cluster: RedisClusterServers) -> Settings:
    """The test's database and prefix, Redis = the cluster (every node a seed); three queues on three primaries."""
    queues = queues_on_three_primaries(cluster, settings.redis_prefix)
    seeds = ",".join(node.url for node in cluster.nodes)  # a process may start while one node is down
    return worker_settings(settings.model_copy(update={"redis_url": seeds, "redis_cluster": True}), queues=queues)


@asynccontextmanager
async def running_relay(settings: Settings, signals: RelaySignals | None = None) -> AsyncIterator[Relay]:
    relay = Relay(settings, signals=signals or RelaySignals.all(), epoch_check_interval=0.2)
    task = asyncio.create_task(relay.run())
    try:
        yield relay
    finally:
        relay.stop()
        await asyncio.wait_for(task, 30)


async def states(aconn: psycopg.AsyncConnection[Any], ids: list[int]) -> dict[str, int]:
    rows = await fetch(aconn, "SELECT state, count(*) FROM postbox.outbox WHERE id = ANY(%s) GROUP BY 1", (ids,))
    await aconn.commit()
    return {str(state): int(n) for state, n in rows}


async def published(aconn: psycopg.AsyncConnection[Any], ids: list[int]) -> int:
    rows = await fetch(
        aconn, "SELECT count(*) FROM postbox.outbox WHERE id = ANY(%s) AND stream_id IS NOT NULL", (ids,)
    )
    await aconn.commit()
    return int(rows[0][0])


async def effects_of(aconn: psycopg.AsyncConnection[Any], ids: list[int]) -> tuple[int, int]:
    """(effects, distinct jobs with an effect) among ``ids``."""
    rows = await fetch(
        aconn, "SELECT count(*), count(DISTINCT job_id) FROM worker_effects WHERE job_id = ANY(%s)", (ids,)
    )
    await aconn.commit()
    return int(rows[0][0]), int(rows[0][1])


def stream_totals(cluster: RedisClusterServers, prefix: str, queues: list[str]) -> tuple[int, int]:
    """(entries, pending entries) over every stream of ``queues``, read through the cluster client."""
    entries = pending = 0
    with cluster.client() as client:
        for queue in queues:
            for key in queue_streams(prefix, queue):
                if client.exists(key):
                    entries += client.xlen(key)
                    pending += int(client.xpending(key, "postbox")["pending"])
    return entries, pending


async def enqueue_spread(
    aconn: psycopg.AsyncConnection[Any], queues: list[str], count: int, label: str, seconds: float = 0.0
) -> list[int]:
    """``count`` effect jobs, round robin over ``queues``, every priority."""
    args = {"seconds": seconds, "label": label}
    return [
        await enqueue(aconn, t.w_slow_effect, args, queue=queues[n % len(queues)], priority=n % 10)
        for n in range(count)
    ]


@pytest.mark.timeout(180)
async def test_every_job_over_three_primaries_runs_once_and_is_acknowledged(
    csettings: Settings, cluster: RedisClusterServers, effects: psycopg.AsyncConnection[Any]
) -> None:
    queues = csettings.queues
    assert len({node_of(cluster, queue_streams(csettings.redis_prefix, q)[0]) for q in queues}) == 3
    ids = await enqueue_spread(effects, queues, 300, "spread")
    async with running_relay(csettings) as relay, running_worker(csettings) as worker:
        await wait_until_async(lambda: _all_succeeded(effects, ids), 90, message="300 jobs succeeded")
        await worker.wait_idle()
        assert relay.published_total >= 300
    assert await effects_of(effects, ids) == (300, 300)
    assert stream_totals(cluster, csettings.redis_prefix, queues) == (0, 0)  # acknowledged and deleted


async def _all_succeeded(aconn: psycopg.AsyncConnection[Any], ids: list[int]) -> bool:
    return await states(aconn, ids) == {"succeeded": len(ids)}


@pytest.mark.timeout(180)
async def test_strict_priority_within_each_queue_and_the_workers_queue_order_across_queues(
    csettings: Settings, effects: psycopg.AsyncConnection[Any]
) -> None:
    first, second = csettings.queues[:2]
    t.STARTED.clear()
    ids: list[int] = []
    for queue in (second, first):  # enqueued second queue first: the worker's order must still win
        for priority in (1, 5, 9, 3, 7, 0, 8):
            ids.append(
                await enqueue(effects, t.w_record, {"label": f"{queue}:{priority}"}, queue=queue, priority=priority)
            )
    async with running_relay(csettings):
        await wait_until_async(lambda: _published_all(effects, ids), 60, message="every job published")
    settings = csettings.model_copy(update={"concurrency": 1, "queues": [first, second]})
    async with running_worker(settings):
        await wait_until_async(lambda: len(t.STARTED) >= len(ids), 60, message="every job started")
    labels = [label for _, label in t.STARTED]
    order = [(q, int(p)) for q, p in (label.split(":") for label in labels)]
    assert [q for q, _ in order] == [first] * 7 + [second] * 7, order
    for queue in (first, second):
        assert [p for q, p in order if q == queue] == [9, 8, 7, 5, 3, 1, 0], order


async def _published_all(aconn: psycopg.AsyncConnection[Any], ids: list[int]) -> bool:
    return await published(aconn, ids) == len(ids)


@pytest.mark.timeout(180)
async def test_queue_stats_of_the_api_and_the_cli_read_the_cluster(
    csettings: Settings,
    cluster: RedisClusterServers,
    effects: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    queues = csettings.queues
    ids = [await enqueue(effects, t.w_noop, queue=queues[n % 3]) for n in range(9)]
    async with running_relay(csettings):
        await wait_until_async(lambda: _published_all(effects, ids), 60, message="every job published")
    with make_client(csettings) as client:
        for queue in queues:
            stats = client.get(f"/api/v1/queues/{queue}").json()
            assert (stats["in_streams"], stats["stream_pending"], stats["redis_error"]) == (3, 0, None), stats
        assert client.get("/ready").status_code == 200
    for name, value in {
        "POSTBOX_DATABASE_URL": str(csettings.database_url),
        "POSTBOX_REDIS_URL": str(csettings.redis_url),
        "POSTBOX_REDIS_CLUSTER": "true",
        "POSTBOX_REDIS_PREFIX": csettings.redis_prefix,
    }.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert await asyncio.to_thread(queues_cli.main, ["list", "--json"]) == 0  # it runs its own event loop
    listed = {q["queue"]: q for q in json.loads(capsys.readouterr().out)}
    for queue in queues:
        assert (listed[queue]["in_streams"], listed[queue]["redis_error"]) == (3, None), listed[queue]


@pytest.mark.timeout(180)
async def test_the_api_websocket_gets_the_relays_and_the_workers_events_over_the_cluster(
    csettings: Settings, effects: psycopg.AsyncConnection[Any]
) -> None:
    """The hub subscribes on the primary of the channel's slot; the relay and the worker count subscribers
    on every primary (PUBSUB NUMSUB is per node), so they publish their events."""
    job = await enqueue(effects, t.w_noop, queue=csettings.queues[1])
    client = redis_conn.connect(csettings)
    try:
        with make_client(csettings) as api, api.websocket_connect(f"/ws/events?job_id={job}") as ws:
            channel = events_channel(csettings.redis_prefix)
            await wait_until_async(lambda: _subscribed(client, channel), 30, message="the API's hub subscribed")
            async with running_relay(csettings), running_worker(csettings):
                seen: list[str] = []
                while "succeeded" not in seen:
                    seen.append((await asyncio.wait_for(asyncio.to_thread(ws.receive_json), 60))["type"])
        assert seen[0] == "published" and seen[-1] == "succeeded", seen
    finally:
        await client.aclose()


async def test_subscribers_are_counted_on_every_primary(csettings: Settings, cluster: RedisClusterServers) -> None:
    """PUBSUB NUMSUB counts one node's subscribers; redis-py's cluster client asks one node unless told."""
    channel = f"{csettings.redis_prefix}:count-me"
    client = redis_conn.connect(csettings)
    try:
        for node in cluster.primaries():
            with node.client() as plain, plain.pubsub() as pubsub:
                pubsub.subscribe(channel)
                assert pubsub.get_message(timeout=5) is not None  # the subscribe confirmation
                assert await redis_conn.subscribers(client, channel) == 1, node.port
    finally:
        await client.aclose()


async def _subscribed(client: Any, channel: str) -> bool:
    return await redis_conn.subscribers(client, channel) > 0


@pytest.mark.timeout(120)
async def test_a_batch_over_three_nodes_fails_only_the_commands_of_a_node_that_does_not_answer(
    csettings: Settings, cluster: RedisClusterServers
) -> None:
    """The relay's and the completer's per-node sending: a frozen primary (SIGSTOP, shorter than the node
    timeout) fails its own commands; the other nodes' replies stand, so the caller retries only those."""
    keys = [queue_streams(csettings.redis_prefix, queue)[4] for queue in csettings.queues]  # three primaries
    commands = [(key, resp.command(b"XADD", key.encode(), b"*", b"id", b"1")) for key in keys]
    client = redis_conn.connect(csettings, socket_timeout=0.5, socket_connect_timeout=0.5)
    frozen_port = node_of(cluster, keys[0])
    frozen = next(node for node in cluster.nodes if node.port == frozen_port)
    assert frozen.proc is not None
    try:
        assert all(isinstance(reply, bytes) for reply in await redis_conn.send_per_node(client, commands))
        frozen.proc.send_signal(signal.SIGSTOP)
        try:
            replies = await redis_conn.send_per_node(client, commands)
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
        assert isinstance(replies[0], Exception), replies
        assert all(isinstance(reply, bytes) for reply in replies[1:]), replies
        await asyncio.to_thread(cluster.wait_ok)
        assert all(isinstance(reply, bytes) for reply in await redis_conn.send_per_node(client, commands))
    finally:
        await client.aclose()


@pytest.mark.timeout(240)
async def test_a_node_that_loses_its_data_is_noticed_and_its_jobs_are_published_again(
    csettings: Settings, cluster: RedisClusterServers, effects: psycopg.AsyncConnection[Any]
) -> None:
    """FLUSHALL on the primary of a queue that does not hold the epoch key: the relay sees its streams gone."""
    prefix = csettings.redis_prefix
    epoch_node = node_of(cluster, epoch_key(prefix))
    victim = next(q for q in csettings.queues if node_of(cluster, queue_streams(prefix, q)[0]) != epoch_node)
    ids = [await enqueue(effects, t.w_slow_effect, {"seconds": 0.0, "label": "lost"}, queue=victim) for _ in range(20)]
    signals = RelaySignals.all()
    async with running_relay(csettings, signals):
        await wait_until_async(lambda: _published_all(effects, ids), 60, message="every job published")
        assert signals.redis_loss is not None
        signals.redis_loss.clear()  # the first check of a fresh epoch counts as a "loss" too
        port = node_of(cluster, queue_streams(prefix, victim)[0])
        with syncredis.Redis(port=port) as node:
            assert sum(node.xlen(key) for key in queue_streams(prefix, victim) if node.exists(key)) == 20
            node.flushall()
        await asyncio.wait_for(signals.redis_loss.wait(), 30)
        async with running_worker(csettings) as worker:
            await wait_until_async(lambda: _all_succeeded(effects, ids), 90, message="the lost jobs succeeded")
            await worker.wait_idle()
    assert await effects_of(effects, ids) == (20, 20)


@pytest.mark.timeout(300)
async def test_a_failover_mid_run_loses_no_job_and_runs_none_twice(
    csettings: Settings, cluster: RedisClusterServers, effects: psycopg.AsyncConnection[Any]
) -> None:
    prefix = csettings.redis_prefix
    queues = csettings.queues
    ids = await enqueue_spread(effects, queues, 300, "before", seconds=0.05)  # 1.5 s of work at least
    async with running_relay(csettings), running_worker(csettings):
        await wait_until_async(lambda: _some_succeeded(effects, ids, 50), 60, message="the run under way")
        owner = node_of(cluster, queue_streams(prefix, queues[1])[0])
        replica = cluster.replica_of(owner)
        with syncredis.Redis(port=replica.port) as node:
            node.execute_command("CLUSTER", "FAILOVER")
        assert (await states(effects, ids)).get("succeeded", 0) < 300  # mid-run
        await asyncio.to_thread(cluster.wait_ok)
        await wait_until_async(
            lambda: node_of(cluster, queue_streams(prefix, queues[1])[0]) == replica.port, 30, message="promoted"
        )
        ids += await enqueue_spread(effects, queues, 150, "after")
        await wait_until_async(lambda: _all_succeeded(effects, ids), 120, message="every job succeeded")
    assert await effects_of(effects, ids) == (450, 450)


async def _some_succeeded(aconn: psycopg.AsyncConnection[Any], ids: list[int], count: int) -> bool:
    return (await states(aconn, ids)).get("succeeded", 0) >= count


@pytest.mark.timeout(300)
async def test_a_failover_to_a_replica_that_missed_the_last_writes_loses_no_job(
    csettings: Settings, cluster: RedisClusterServers, effects: psycopg.AsyncConnection[Any]
) -> None:
    """The replica of a queue's primary is frozen (SIGSTOP) and cut off while the relay publishes more; the
    primary dies; the replica, resumed, is promoted without those entries. The relay's per-stream high-water
    check notices (the epoch key, on another node or not, says nothing), and every job runs once.

    Runs last in this module: the killed primary comes back as a replica of its successor."""
    prefix = csettings.redis_prefix
    queue = csettings.queues[2]
    key = queue_streams(prefix, queue)[0]
    primary_port = node_of(cluster, key)
    primary = next(node for node in cluster.nodes if node.port == primary_port)
    replica = cluster.replica_of(primary_port)
    assert replica.proc is not None and primary.proc is not None
    first = [await enqueue(effects, t.w_slow_effect, {"seconds": 0.0, "label": "kept"}, queue=queue) for _ in range(20)]
    signals = RelaySignals.all()
    async with running_relay(csettings, signals):
        await wait_until_async(lambda: _published_all(effects, first), 60, message="the first 20 published")
        with primary.client() as node:
            assert node.wait(1, 10_000) == 1  # the replica has them
        replica.proc.send_signal(signal.SIGSTOP)
        try:
            with primary.client() as node:  # the link's socket closes: nothing more reaches the frozen replica
                node.execute_command("CLIENT", "KILL", "TYPE", "replica")
            lost = [
                await enqueue(effects, t.w_slow_effect, {"seconds": 0.0, "label": "lost"}, queue=queue)
                for _ in range(20)
            ]
            await wait_until_async(
                lambda: _published_all(effects, lost), 60, message="20 more published to the primary only"
            )
            assert signals.redis_loss is not None
            signals.redis_loss.clear()
            primary.stop()
        finally:
            replica.proc.send_signal(signal.SIGCONT)
        await wait_until_async(lambda: _owned_by(cluster, key, replica.port), 90, message="the stale replica promoted")
        await asyncio.wait_for(signals.redis_loss.wait(), 60)  # the tail's high-water mark
        async with running_worker(csettings) as worker:
            await wait_until_async(lambda: _all_succeeded(effects, first + lost), 90, message="every job succeeded")
            await worker.wait_idle()
    assert await effects_of(effects, first + lost) == (40, 40)
    primary.start()  # it rejoins as a replica of the promoted node
    await asyncio.to_thread(cluster.wait_ok)


def _owned_by(cluster: RedisClusterServers, key: str, port: int) -> bool:
    try:
        return node_of(cluster, key) == port
    except syncredis.RedisError:
        return False
