"""The Redis client factory (postbox.redis_conn) and its settings: no server needed (nothing connects)."""

from __future__ import annotations

import pytest
import redis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from postbox import redis_conn
from postbox.errors import SettingsError
from postbox.settings import Settings, load_settings
from postbox.startup import cluster_refusal

# The cluster client needs redis-py 8 (redis_conn.CLUSTER_MIN_REDIS_PY); an environment with
# postbox[bench] has redis-py 5 (arq pins it), where making one is refused (the last test).
needs_cluster_client = pytest.mark.skipif(
    redis_conn.version_tuple(redis.__version__) < redis_conn.CLUSTER_MIN_REDIS_PY,
    reason=f"redis-py {redis.__version__} has no usable asyncio cluster client",
)


@needs_cluster_client
def test_a_plain_url_gives_a_plain_client_and_the_cluster_setting_a_cluster_client() -> None:
    plain = redis_conn.connect(Settings(redis_url="redis://127.0.0.1:6399/0"))
    assert type(plain) is Redis and not redis_conn.is_cluster(plain)
    cluster = redis_conn.connect(Settings(redis_url="redis://127.0.0.1:6399", redis_cluster=True))
    assert isinstance(cluster, RedisCluster) and redis_conn.is_cluster(cluster)


@needs_cluster_client
def test_several_seed_nodes_make_one_cluster_client_with_every_seed() -> None:
    url = " redis://127.0.0.1:7001 , redis://127.0.0.1:7002,redis://localhost:7003,"
    assert redis_conn.seed_urls(url) == ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://localhost:7003"]
    client = redis_conn.connect_url(url, cluster=True)
    assert isinstance(client, RedisCluster)
    seeds = {(node.host, int(node.port)) for node in client.nodes_manager.startup_nodes.values()}
    assert seeds == {("127.0.0.1", 7001), ("127.0.0.1", 7002), ("127.0.0.1", 7003)}


def test_several_urls_without_the_cluster_setting_are_refused_before_connecting() -> None:
    seeds = "redis://127.0.0.1:7001,redis://127.0.0.1:7002"
    with pytest.raises(SettingsError, match="several URLs need POSTBOX_REDIS_CLUSTER=true"):
        redis_conn.connect(Settings(redis_url=seeds))
    assert cluster_refusal(seeds) == "POSTBOX_REDIS_URL: several URLs need POSTBOX_REDIS_CLUSTER=true"


def test_the_settings_read_the_cluster_flag_and_check_every_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTBOX_REDIS_CLUSTER", "true")
    monkeypatch.setenv("POSTBOX_REDIS_URL", "redis://a:1,rediss://b:2")
    settings = load_settings()
    assert settings.redis_cluster is True and settings.redis_url == "redis://a:1,rediss://b:2"
    monkeypatch.setenv("POSTBOX_REDIS_URL", "redis://a:1,http://b:2")
    with pytest.raises(SettingsError, match="POSTBOX_REDIS_URL"):
        load_settings()
    monkeypatch.setenv("POSTBOX_REDIS_CLUSTER", "maybe")
    monkeypatch.setenv("POSTBOX_REDIS_URL", "redis://a:1")
    with pytest.raises(SettingsError, match="POSTBOX_REDIS_CLUSTER"):
        load_settings()


def test_a_cluster_on_a_redis_py_without_the_cluster_commands_is_refused_naming_the_version() -> None:
    for old in ("5.3.1", "7.4.0", "4.6.0rc1"):
        with pytest.raises(SettingsError, match=rf"needs redis-py >= 8\.0 .* has redis-py {old}\b.*arq"):
            redis_conn.check_cluster_support(old)
    for fine in ("8.0.0", "8.1.0", "8.0.0b1", "10.2"):
        redis_conn.check_cluster_support(fine)
    assert redis_conn.version_tuple("8.0.0b1") == (8, 0) and redis_conn.version_tuple("7") == (7, 0)
