"""The Redis client factory (postbox.redis_conn) and its settings: no server needed (nothing connects)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from postbox import redis_conn
from postbox.errors import SettingsError
from postbox.settings import Settings, load_settings
from postbox.startup import cluster_refusal


def test_a_plain_url_gives_a_plain_client_and_the_cluster_setting_a_cluster_client() -> None:
    plain = redis_conn.connect(Settings(redis_url="redis://127.0.0.1:6399/0"))
    assert type(plain) is Redis and not redis_conn.is_cluster(plain)
    cluster = redis_conn.connect(Settings(redis_url="redis://127.0.0.1:6399", redis_cluster=True))
    assert isinstance(cluster, RedisCluster) and redis_conn.is_cluster(cluster)


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
