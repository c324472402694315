"""Redis clients for postbox's processes: one server, or a Redis Cluster.

Every process builds its Redis client here (:func:`connect`): a plain
``redis.asyncio.Redis`` for one server (with replicas, Sentinel or not), or
``redis.asyncio.cluster.RedisCluster`` when ``POSTBOX_REDIS_CLUSTER`` is set
(``POSTBOX_REDIS_URL`` then names one or several nodes of the cluster,
comma-separated; the client discovers the others and follows slot moves and
failovers).

The hot paths send raw, pre-encoded batches (:mod:`postbox.resp`). On one server a
batch is one write on one connection; on a cluster a batch spans slots of
several nodes, so :func:`send_per_node` splits it by node and writes each
node's share in parallel, keeping one reply per command (a node that fails
fails its own commands only).

Key layout on a cluster: the ``{queue}`` hash tag keeps all of a queue's
streams in one slot (:mod:`postbox.streams`), so every per-queue operation (the
worker's read script, XACK+XDEL, XAUTOCLAIM) stays single-slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, TypeAlias, cast
from urllib.parse import urlsplit

import redis
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from postbox import resp
from postbox.errors import SettingsError
from postbox.settings import Settings

AnyRedis: TypeAlias = Redis | RedisCluster

__all__ = [
    "AnyRedis",
    "cluster_mode",
    "connect",
    "connect_url",
    "create_groups",
    "is_cluster",
    "seed_urls",
    "send",
    "send_per_node",
    "subscribers",
]


def connect(settings: Settings, **options: Any) -> AnyRedis:
    """The Redis client ``settings`` ask for (``POSTBOX_REDIS_URL``, ``POSTBOX_REDIS_CLUSTER``).

    ``options`` go to the client (``socket_timeout``, ``decode_responses``, ...).
    Raises :class:`~postbox.errors.SettingsError` when no Redis URL is set.
    """
    return connect_url(settings.require_redis_url(), cluster=settings.redis_cluster, **options)


def connect_url(url: str, *, cluster: bool = False, **options: Any) -> AnyRedis:
    """A client for ``url``: a cluster client seeded with its node(s) when ``cluster``, else a plain one.

    On a cluster ``url`` may name several nodes, comma-separated
    (``redis://a:6379,redis://b:6379``): a process starting while one of them
    is down asks the next. Once connected, the client knows every node.
    Nothing is connected yet: the first command connects (and, on a cluster,
    reads the slot map).
    """
    seeds = seed_urls(url)
    if not cluster:
        if len(seeds) != 1:
            raise SettingsError("POSTBOX_REDIS_URL: several URLs need POSTBOX_REDIS_CLUSTER=true")
        return Redis.from_url(seeds[0], **options)
    others = [ClusterNode(parsed.hostname or "127.0.0.1", parsed.port or 6379) for parsed in map(urlsplit, seeds[1:])]
    return RedisCluster.from_url(seeds[0], startup_nodes=others or None, **options)


def seed_urls(url: str) -> list[str]:
    """The URLs of a comma-separated ``POSTBOX_REDIS_URL`` (one for a plain server)."""
    return [part.strip() for part in url.split(",") if part.strip()]


async def run_script(script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """Run a registered script (``register_script``) on the node serving ``keys``.

    redis-py loads a script the server lacks and tries once more, but on a cluster
    it loads it on the primaries it knows: just after a failover that list can
    still miss the promoted node, which has no script cache of its own. Then the
    script's text is sent (EVAL), which the node serving the keys runs and keeps.
    """
    try:
        return await script(keys=keys, args=args)
    except rex.NoScriptError:
        return await script.registered_client.eval(script.script, len(keys), *keys, *args)


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


async def send_per_node(client: RedisCluster, commands: Sequence[tuple[str, bytes]]) -> list[Any]:
    """Send pre-encoded commands (``(routing key, RESP bytes)``) to a cluster: one write per node, in parallel.

    The commands are grouped by the primary that owns their key's slot (the
    client's slot map), each node's share goes out as one buffer on one of its
    connections (:func:`postbox.resp.exchange`), and the replies come back in the
    order of ``commands``: values, or exception instances for error replies
    (``MOVED`` after a slot moved, ``CLUSTERDOWN``...). A node that cannot be
    reached gives its commands the connection error, and the others' replies
    stand: the caller retries exactly the commands that failed, as it does with
    refused ones on one server. After any failure the slot map is read again.
    """
    if not commands:
        return []
    await client.initialize()  # a no-op once the slot map is known
    groups: dict[str, tuple[ClusterNode, list[int]]] = {}
    results: list[Any] = [None] * len(commands)
    for index, (key, _payload) in enumerate(commands):
        try:
            node = client.get_node_from_key(key)
        except rex.RedisError as exc:  # a slot no node serves (mid-failover)
            results[index] = exc
            continue
        assert node is not None
        groups.setdefault(node.name, (node, []))[1].append(index)

    async def send(node: ClusterNode, indexes: list[int]) -> None:
        payload = b"".join(commands[index][1] for index in indexes)
        try:
            replies = await _exchange_with(node, payload, len(indexes))
        except (rex.RedisError, OSError) as exc:
            replies = [exc] * len(indexes)
        for index, reply in zip(indexes, replies, strict=True):
            results[index] = reply

    await asyncio.gather(*(send(node, indexes) for node, indexes in groups.values()))
    if any(isinstance(reply, _STALE_MAP) for reply in results):
        with contextlib.suppress(rex.RedisError, OSError):
            await client.nodes_manager.initialize()  # where the slots are now (after a failover or a move)
    return results


async def send(client: AnyRedis, commands: Sequence[tuple[str, bytes]]) -> list[Any]:
    """Pre-encoded commands (``(routing key, RESP bytes)``): one write on one server
    (:func:`postbox.resp.send_batch`), one per node on a cluster (:func:`send_per_node`); the replies in
    order, error replies as exception instances."""
    if is_cluster(client):
        return await send_per_node(cast(RedisCluster, client), commands)
    return await resp.send_batch(cast(Redis, client), b"".join(payload for _key, payload in commands), len(commands))


async def create_groups(client: AnyRedis, streams: Sequence[str], group: str) -> list[BaseException | None]:
    """``XGROUP CREATE <stream> <group> 0 MKSTREAM`` for each of ``streams``, in one write (per node on a
    cluster): per stream, None when the group is there (made now, or ``BUSYGROUP``), else the error.

    Packed by hiredis instead of redis-py's pipeline: for 1,000 new streams (a relay's first batch over
    100 queues x 10 priorities, a worker starting on them) 1.6 ms of CPU instead of 11.6
    (docs/benchmarks.md, "twenty-third round"). On a cluster a stale slot map comes back as the
    streams' ``MOVED`` errors, the map is read again, and the caller tries again."""
    name = group.encode()
    commands = [(key, resp.command(b"XGROUP", b"CREATE", key.encode(), name, b"0", b"MKSTREAM")) for key in streams]
    replies = await send(client, commands)
    return [reply if isinstance(reply, BaseException) and "BUSYGROUP" not in str(reply) else None for reply in replies]


# Replies that say the slot map is out of date (or a node is gone): read it again.
_STALE_MAP = (rex.MovedError, rex.AskError, rex.ClusterDownError, rex.TryAgainError, rex.ConnectionError, OSError)


async def _exchange_with(node: ClusterNode, payload: bytes, replies: int) -> list[Any]:
    """One buffer on one of ``node``'s pooled connections (the cluster client's own pool of that node)."""
    conn = node.acquire_connection()
    try:
        reconnect = getattr(node, "disconnect_if_needed", None)  # redis-py 8: a connection marked after a failover
        if reconnect is not None:
            await reconnect(conn)
        return await resp.exchange(conn, payload, replies)
    finally:
        node.release(conn)


async def subscribers(client: AnyRedis, channel: str | bytes) -> int:
    """Clients subscribed to ``channel`` (``PUBSUB NUMSUB``).

    On a cluster each node counts its own subscribers, and redis-py asks one
    node only: this asks every primary and adds up. A subscriber through
    redis-py's cluster pub/sub (the API's event hub) sits on the primary owning
    the channel's slot; one connected to a replica is not counted.
    """
    if isinstance(client, RedisCluster):
        found = await client.pubsub_numsub(channel, target_nodes=RedisCluster.PRIMARIES)
    else:
        found = await client.pubsub_numsub(channel)
    return int(found[0][1]) if found else 0


def cluster_mode(url: str, timeout: float = 2.0) -> bool | None:
    """Whether the server at ``url`` is a Redis Cluster node; ``None`` when it cannot be asked (down).

    Of several comma-separated URLs, the first that answers says.
    """
    for seed in seed_urls(url):
        client = redis.Redis.from_url(seed, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            info: Any = client.info("cluster")  # typed differently across redis-py 5.3 .. 8
        except redis.RedisError:
            continue
        finally:
            client.close()
        return bool(info.get("cluster_enabled"))
    return None
