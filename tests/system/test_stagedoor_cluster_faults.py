"""The Stagedoor fault test on a Redis Cluster, with a node failover in the mix.

The scenario of ``tests/system/test_stagedoor_faults.py`` (the api, two relays,
three workers, the mail provider failing 10% of sends after delivering them;
workers SIGKILLed, the leading relay SIGKILLed twice, a worker SIGSTOPped past
the visibility timeout, the workers' database sessions terminated) on the
harness's cluster — three primaries with a replica each — with
``POSTBOX_REDIS_CLUSTER=true`` and three seed URLs. Its Redis fault, halfway
through, is two faults on two different nodes:

- ``CLUSTER FAILOVER`` of the primary holding the ``stagedoor`` queue (render,
  sales counter) by its replica: that queue's slot moves mid-run;
- ``FLUSHALL`` of the primary holding the ``mail`` queue: one node loses its
  data (the emails' streams and group), the others keep theirs.

Then the same invariants: one PDF and one email per order, seats summed, no
job dead or unfinished, emails at the rate limit (the busiest second of
postbox's claims of the sends within the limit + 25%; of the handlers' starts
and of deliveries at the provider, within + 50%: what comes after the claim
jitters more with six Redis servers on the machine's two cores). The test
prints how long the failover took and when the jobs committed before it were
all done.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from postbox.streams import queue_streams
from tests.harness.redis_cluster import RedisClusterServers, running_cluster
from tests.system.test_stagedoor_faults import (
    CLAIM_TTL,
    EMAIL_RATE,
    Cluster,
    make_logs,
    run_fault_scenario,
    stagedoor_env,
)

pytestmark = [pytest.mark.system, pytest.mark.alone]  # the email rate, at the handlers

ORDERS = 300
RATE = 25.0
FAILED_OVER_QUEUE = "stagedoor"  # render_tickets, update_sales_counter
FLUSHED_QUEUE = "mail"  # send_tickets; "stagedoor" and "mail" hash to different primaries


@dataclass
class NodeFaults:
    """The scenario's Redis fault on the cluster, and when it happened."""

    servers: RedisClusterServers
    prefix: str
    database_url: str
    log: list[str] = field(default_factory=list)
    at: float | None = None  # time.time() of the failover command
    last_id: int = 0  # the newest outbox id when it came

    def owner(self, queue: str) -> int:
        with self.servers.client() as client:
            client.nodes_manager.initialize()  # the slot map as it is now
            return int(client.get_node_from_key(queue_streams(self.prefix, queue)[0]).port)

    def __call__(self) -> None:
        failed_over, flushed = self.owner(FAILED_OVER_QUEUE), self.owner(FLUSHED_QUEUE)
        assert failed_over != flushed
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            row = conn.execute("SELECT coalesce(max(id), 0) FROM postbox.outbox").fetchone()
        self.last_id = int(row[0]) if row else 0
        replica = self.servers.replica_of(failed_over)
        self.at = time.time()
        started = time.monotonic()
        with replica.client() as node:
            node.execute_command("CLUSTER", "FAILOVER")
        self.servers.wait_ok(60)
        took = time.monotonic() - started
        by_port = {node.port: node for node in self.servers.nodes}
        with by_port[flushed].client() as node:
            node.flushall()  # replicated: the node and its replica lose the mail queue's streams
        self.log.append(
            f"failover of {failed_over} ({FAILED_OVER_QUEUE}) by {replica.port}: cluster ok after {took:.2f} s;"
            f" FLUSHALL of {flushed} ({FLUSHED_QUEUE})"
        )


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisClusterServers]:
    with running_cluster(tmp_path / "redis-cluster") as found:
        yield found


@pytest.fixture
def cluster(child_env: dict[str, str], redis_cluster: RedisClusterServers, tmp_path: Path) -> Iterator[Cluster]:
    seeds = ",".join(node.url for node in redis_cluster.nodes[:3])
    env = stagedoor_env(child_env, seeds, tmp_path)
    env["POSTBOX_REDIS_CLUSTER"] = "true"
    found = Cluster(env, make_logs(tmp_path))
    try:
        yield found
    finally:
        found.stop_all()


def done_after(database_url: str, faults: NodeFaults) -> dict[str, float]:
    """Per queue: seconds from the failover to the last outcome of a job committed before it."""
    assert faults.at is not None
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT queue, extract(epoch FROM max(finished_at))::float8 FROM postbox.outbox WHERE id <= %s GROUP BY 1",
            (faults.last_id,),
        ).fetchall()
    return {str(queue): float(last) - faults.at for queue, last in rows}


def busiest_seconds(database_url: str) -> dict[str, tuple[int, float]]:
    """The busiest one-second window of the emails' starts (the handlers' clock at their send's claim), of their
    sends, and of postbox's claims of their attempts (what the limiter allowed): (count, epoch seconds of its start)."""
    queries = {
        "started": "SELECT extract(epoch FROM claimed_at)::float8 FROM stagedoor.email_sends",
        "sent": "SELECT extract(epoch FROM sent_at)::float8 FROM stagedoor.email_sends WHERE sent_at IS NOT NULL",
        # every attempt's claim (postbox's clock of the start the limiter allowed), lost and retried ones too
        "claimed": "SELECT extract(epoch FROM a.started_at)::float8 FROM postbox.job_attempts a"
        " JOIN postbox.outbox o ON o.id = a.outbox_id WHERE o.task = 'send_tickets'",
    }
    found = {}
    with psycopg.connect(database_url, autocommit=True) as conn:
        for what, query in queries.items():
            times = sorted(float(t) for (t,) in conn.execute(query).fetchall())
            counts = [bisect.bisect_left(times, t + 1.0) - i for i, t in enumerate(times)]
            i = max(range(len(times)), key=counts.__getitem__, default=None)
            found[what] = (0, 0.0) if i is None else (counts[i], times[i])
    return found


@pytest.mark.timeout(300)
def test_stagedoor_exactly_once_under_faults_on_a_cluster_through_a_failover_and_a_node_losing_its_data(
    database_url: str, cluster: Cluster, redis_cluster: RedisClusterServers
) -> None:
    faults = NodeFaults(redis_cluster, cluster.env["POSTBOX_REDIS_PREFIX"], database_url)
    fault: Callable[[], None] = faults
    try:
        # Deliveries are counted at the provider, after the HTTP call: on this machine the cluster's six
        # server processes share the two cores, and the start-to-delivery gap jitters more than on one
        # server (busiest seconds of 21-28 deliveries over 14 runs, of 21-22 starts where starts were
        # measured): the rate is held on the starts below.
        run_fault_scenario(
            database_url, cluster, fault, ORDERS, RATE, 60 + 3 * CLAIM_TTL, busiest_deliveries=EMAIL_RATE * 1.5
        )
    finally:
        print("\n".join(faults.log))
        if faults.at is not None:
            print("busiest second of the emails (count, from the failover): " + ", ".join(
                f"{what} {n} at {t - faults.at:+.2f} s" for what, (n, t) in busiest_seconds(database_url).items()
            ))  # fmt: skip
    assert faults.at is not None
    busiest = busiest_seconds(database_url)
    # The limiter's own record, each attempt's claim: at most the limit plus two or three starts in any
    # one-second window (docs/flow-control.md).
    assert busiest["claimed"][0] <= EMAIL_RATE * 1.25
    # The handlers' clock at their send's claim comes a database round trip or more after postbox's claim,
    # and bunches as the deliveries do when a handler's own session stalls (once in 9 runs: 26 starts, and
    # 26 deliveries 30 ms later, in one second): held to the deliveries' bound.
    assert busiest["started"][0] <= EMAIL_RATE * 1.5
    # "mail" jobs wait behind the 20/s email limit: their figure is the backlog's, not the fault's; the
    # "stagedoor" jobs wait behind the emails too (the same on one server: 14.5 s in a run of this scenario).
    after = done_after(database_url, faults)
    print("jobs committed before the failover, last one done after it: " + ", ".join(
        f"{queue} {seconds:.1f} s" for queue, seconds in sorted(after.items())
    ))  # fmt: skip
