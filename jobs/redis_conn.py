"""Redis clients for postbox's processes: one server, or a Redis Cluster.

Every process builds its Redis client here (:func:`connect`): a plain
``redis.asyncio.Redis`` for one server (with replicas, Sentinel or not), or
``redis.asyncio.cluster.RedisCluster`` when ``POSTBOX_REDIS_CLUSTER`` is set
(``POSTBOX_REDIS_URL`` then names any node of the cluster; the client discovers
the others and follows slot moves and failovers).

The hot paths keep their raw, pre-encoded batches (:mod:`jobs.resp`) on one
server. On a cluster a batch spans slots of several nodes, so it goes through
:func:`run_commands`: the cluster client's pipeline, which groups the commands
by node, writes each node's share in parallel and follows MOVED/ASK replies.

Key layout on a cluster: the ``{queue}`` hash tag keeps all of a queue's
streams in one slot (:mod:`jobs.streams`), so every per-queue operation (the
worker's read script, XACK+XDEL, XAUTOCLAIM) stays single-slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import redis
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from postbox.errors import SettingsError
from postbox.settings import Settings

AnyRedis: TypeAlias = Redis | RedisCluster

__all__ = [
    "AnyRedis",
    "cluster_mode",
    "connect",
    "connect_url",
    "is_cluster",
    "run_commands",
    "seed_urls",
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


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


async def run_commands(client: AnyRedis, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Run ``commands`` (each ``(NAME, *args)``), on a cluster above all; one reply per command, in order.

    The commands go out per node in parallel (the cluster client's pipeline);
    error replies come back as exception instances, as :func:`jobs.resp.send_batch`
    returns them. A failure of a node's connection raises (after the client's own
    retries on a refreshed slot map).
    """
    if not commands:
        return []
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(await pipe.execute(raise_on_error=False))


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
