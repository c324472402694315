"""An encrypted task's kept result (issue 32, item 6): sealed by the worker, bound to its job, opened by
readers that have the key, resealed by a rotation. Real PostgreSQL, Redis and the worker in-process."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest
import redis.asyncio as aioredis

from postbox import encryption, results
from postbox.app.services import sealing
from postbox.settings import Settings
from tests.harness.api import API_KEY, make_client
from tests.harness.publish import publish_due
from tests.harness.tasks import job_control as jc
from tests.harness.worker import enqueue, fetch, finished, running_worker

K1 = "k1:" + base64.b64encode(b"1" * 32).decode()
K2 = "k2:" + base64.b64encode(b"2" * 32).decode()
CARD = "5500-0000-0000-0004"


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("POSTBOX_ENCRYPTION_KEYS", raising=False)
    encryption.use_keys(K1)
    yield
    encryption.use_keys(None)


async def test_a_kept_result_is_sealed_to_its_job_opened_with_the_key_and_resealed_by_a_rotation(
    wsettings: Settings, effects: psycopg.AsyncConnection[Any], redis: aioredis.Redis, settings: Settings
) -> None:
    aconn = effects
    first = await enqueue(aconn, jc.jc_secret_result, {"card": CARD, "n": 1})
    second = await enqueue(aconn, jc.jc_secret_result, {"card": CARD, "n": 2})
    await publish_due(aconn, redis, wsettings.redis_prefix)
    async with running_worker(wsettings.model_copy(update={"queues": [jc.QUEUE]})) as worker:
        assert sorted(await finished(worker, 2)) == [(first, "succeeded"), (second, "succeeded")]
    stored = dict(await fetch(aconn, "SELECT id, result::text FROM postbox.outbox"))
    assert all(CARD not in text for text in stored.values())
    sealed = orjson.loads(stored[first])
    assert set(sealed) == {"$postbox_encrypted"} and sealed["$postbox_encrypted"]["kid"] == "k1"

    # Readers with the key get the value: the Python API, and the REST API for a reader with the API key.
    got = await results.get_result_async(aconn, first)
    assert got is not None and got.value == {"card": CARD, "n": 1}
    with make_client(settings, api_key=API_KEY) as client:
        keyed = {"X-API-Key": API_KEY}
        assert client.get(f"/api/v1/jobs/{first}", headers=keyed).json()["result"] == {"card": CARD, "n": 1}
        assert client.get(f"/api/v1/jobs/{first}/result", headers=keyed).json()["result"] == {"card": CARD, "n": 1}
        assert client.get(f"/api/v1/jobs/{first}/result").json()["result"] is None  # no API key: redacted

    # Bound to its job: the first job's sealed result copied onto the second does not open there.
    await aconn.execute("UPDATE postbox.outbox SET result = %s::jsonb WHERE id = %s", (stored[first], second))
    await aconn.commit()
    swapped = await results.get_result_async(aconn, second)
    assert swapped is not None and swapped.value == sealed  # the envelope, never another job's value
    await aconn.execute("UPDATE postbox.outbox SET result = %s::jsonb WHERE id = %s", (stored[second], second))
    await aconn.commit()

    # Rotation: k2 first; reencrypt reseals the args and the results; k1 can then go.
    encryption.use_keys(f"{K2},{K1}")
    done = await sealing.reseal(aconn, encryption.keyring(), batch=1)
    assert (done.resealed, done.changed_meanwhile, done.failed) == (4, 0, [])  # two args, two results
    kids = await fetch(aconn, "SELECT DISTINCT result->'$postbox_encrypted'->>'kid' FROM postbox.outbox")
    assert kids == [("k2",)]
    encryption.use_keys(K2)
    got = await results.get_result_async(aconn, second)
    assert got is not None and got.value == {"card": CARD, "n": 2}
    assert (await sealing.reseal(aconn, encryption.keyring())).resealed == 0

    # Without any key the value stays sealed: the envelope, not a decode.
    encryption.use_keys(None)
    got = await results.get_result_async(aconn, second)
    assert got is not None and encryption.is_sealed(got.value) and CARD not in str(got.value)


def test_postbox_testing_sees_runs_and_seals_an_encrypted_task_as_the_worker_does(
    conn: psycopg.Connection[Any],
) -> None:
    """In a test transaction: assert_enqueued matches the opened args, run_enqueued_sync opens them for the
    handler and seals the kept result; without the key the run fails with the key's name, not a decode."""
    import postbox
    from postbox import testing

    job_id = postbox.enqueue(conn, jc.jc_secret_result, {"card": CARD, "n": 5})
    assert CARD not in str(conn.execute("SELECT args FROM postbox.outbox").fetchone())
    testing.assert_enqueued(conn, jc.jc_secret_result, args={"card": CARD, "n": 5})
    (run,) = testing.run_enqueued_sync(conn, jc.jc_secret_result)
    assert (run.job_id, run.state, run.result) == (job_id, "succeeded", {"card": CARD, "n": 5})
    stored = conn.execute("SELECT result FROM postbox.outbox WHERE id = %s", (job_id,)).fetchone()
    assert stored is not None and encryption.is_sealed(stored[0]) and CARD not in str(stored[0])
    got = results.get_result(conn, job_id)
    assert got is not None and got.value == {"card": CARD, "n": 5}

    other = postbox.enqueue(conn, jc.jc_secret_result, {"card": CARD, "n": 6})
    encryption.use_keys(K2)  # not the key it was sealed with
    (failed,) = testing.run_enqueued_sync(conn, jc.jc_secret_result, retries=False)
    assert (failed.job_id, failed.state, failed.error_class) == (other, "retrying", "EncryptionError")
    assert failed.error is not None and "sealed with key 'k1', which this process does not have" in failed.error
