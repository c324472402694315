"""Scripts on a node that lacks them: redis-py's own retry loads the script where it
believes the keys live; when that is not the node that answers (a cluster client
whose map of primaries is a failover behind), ``redis_conn.run_script`` sends the
script's text, and the node that runs it keeps it."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from postbox import redis_conn

SCRIPT = "return {KEYS[1], ARGV[1]} -- %s"  # the test's prefix: a script no server has seen (no SCRIPT FLUSH
# of the shared server, whose other tests' scripts stay loaded)


class LoadsElsewhere(Redis):
    """SCRIPT LOAD answered but not done here, as on a cluster client loading on a demoted primary."""

    async def script_load(self, script: Any) -> str:
        return hashlib.sha1(script.encode() if isinstance(script, str) else script).hexdigest()


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[LoadsElsewhere]:
    own = LoadsElsewhere.from_url(redis_url)
    try:
        yield own
    finally:
        await own.aclose()


async def test_a_script_the_node_lacks_is_sent_whole_and_kept_there(client: LoadsElsewhere, redis_prefix: str) -> None:
    script = client.register_script(SCRIPT % redis_prefix)
    assert await client.script_exists(script.sha) == [False]
    with pytest.raises(NoScriptError):  # redis-py's own load-and-retry does not reach this node
        await script(keys=[f"{redis_prefix}:k"], args=["a"])
    assert await redis_conn.run_script(script, [f"{redis_prefix}:k"], ["a"]) == [f"{redis_prefix}:k".encode(), b"a"]
    assert await client.script_exists(script.sha) == [True]  # the next EVALSHA finds it
    assert await script(keys=[f"{redis_prefix}:k"], args=["b"]) == [f"{redis_prefix}:k".encode(), b"b"]


async def test_other_errors_are_not_retried(client: LoadsElsewhere, redis_prefix: str) -> None:
    script = client.register_script("return redis.error_reply('BROKEN on purpose')")
    with pytest.raises(Exception, match="BROKEN on purpose"):
        await redis_conn.run_script(script, [f"{redis_prefix}:k"], [])
