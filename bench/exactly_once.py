"""``bench exactly-once``: ``ctx.transaction()`` jobs/s against what PostgreSQL commits for the same statements.

Per repetition, on ``--jobs`` N committed jobs each time (same database, same
minutes):

1. **pgbench, the job's transaction** (``exactly_once.pgbench_tx``): the jobs
   are first marked running under the claim of a pretend worker (untimed);
   then pgbench runs, per job, exactly the statements of a ``ctx.transaction()``
   job's own transaction, as the worker sends them (the texts come from
   ``jobs/sql.py``; see :func:`scripts`): ``BEGIN``; PROCESSED_BEGIN;
   the handler's effect (one row into ``public.bench_effects``, as
   ``bench_effect`` writes it); JOB_RECORD_SUCCESS for
   that job (the fenced success, raising if refused); ``COMMIT``. The worker
   sends ``BEGIN`` with the processed row, and the outcome with ``COMMIT``, in
   one round trip each (one simple query of two statements); pgbench sends
   each statement on its own and waits for its answer (not pipelined), so
   this is PostgreSQL's bound for these statements, not a copy of the
   worker's traffic. Each pgbench
   transaction takes the next job id from a sequence, so every job is done
   once. This is the limit the issue names: what PostgreSQL can commit for a
   job's effect, its processed-jobs row and its outcome.
2. **pgbench, claim + transaction** (``exactly_once.pgbench_claim_tx``): the
   same, preceded by JOB_CLAIM_ATTEMPTS of that one job (its own transaction,
   asynchronous commit, as the worker's claim). The worker claims a whole
   read's batch in one statement, so this bound is lower than what a worker
   needs per job; it is shown, not held to a target.
3. **postbox** (``exactly_once.postbox``): the same N jobs of ``bench_effect``
   drained by one relay and one worker process at ``--concurrency`` (rate from
   the outcomes' ``finished_at``, as ``bench worker``).

5. **The floor** (with ``--floor``; ``exactly_once.postbox``, system
   ``floor``): right after each postbox drain, the same N jobs drained by
   the delivery contract's shortest path with postbox's own job transaction
   (:mod:`postbox_bench.floor`'s ``effect`` worker at the same concurrency),
   timed the same way; paired. ``exactly_once.floor_pgqueuer`` is floor /
   PgQueuer per repetition: what the contract itself leaves of the target.
   With asyncpg installed (the bench extra) the floor runs a second time with
   its jobs' transactions on asyncpg (system ``floor-asyncpg``, the same three
   sends per job; ``exactly_once.floor_asyncpg_pgqueuer``): what the driver
   costs, apart from the statements. pgbench then also runs the effect row
   alone (``exactly_once.pgbench_effect``: ``BEGIN``, the row, ``COMMIT``, the
   transaction PgQueuer's handler commits), and
   ``exactly_once.pgbench_tx_effect`` is the job's transaction / that, per
   repetition: what the contract's statements cost PostgreSQL beside the
   effect itself.

The ratio ``exactly_once.ratio`` is postbox / pgbench's job transaction, per
repetition (target >= 0.8); ``exactly_once.ratio_claim`` the same against 2.

pgbench clients: the worker's connection pool holds at most
``min(concurrency, 20) + 4`` connections (worker/worker.py) — its claims,
outcomes, control and the handlers' transactions — so pgbench runs with that
many clients (24 at the default concurrency 50), two threads (``-j 2``),
prepared statements (psycopg prepares a statement run often).

The worker also reads and acknowledges each delivery in Redis, and the relay
publishes and marks each job: work pgbench does not do. Without pgbench on
PATH the pgbench figures are skipped with the reason in their label.

4. **PgQueuer writing the same effect** (``exactly_once.pgqueuer``, with the
   bench extra installed): the same N jobs enqueued in bulk in PgQueuer's
   own database, one worker process in its best configuration
   (``pgqueuer_peer.BEST``) whose handler writes the same effect row in a
   transaction of its own on an asyncpg pool as large as postbox's, timed by
   the handler's tally after each commit; ``exactly_once.ratio_pgqueuer`` is
   postbox / PgQueuer per repetition. PgQueuer cannot commit the effect with
   the job's completion (a crash between the two runs the handler again), so
   it does less than postbox here.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any, LiteralString

import psycopg

from postbox import sql
from postbox_bench import floor as shortest
from postbox_bench import outbox, pgbench
from postbox_bench import worker as bench_worker
from postbox_bench.params import Params
from postbox_bench.procs import bench_env
from postbox_bench.progress import Progress
from postbox_bench.report import FLOOR, Figure, Report, Target
from postbox_bench.sandbox import Sandbox
from postbox_bench.tasks import EFFECTS_DDL

SCENARIO = "exactly-once"
TASK = "bench_effect"
WORKER = "pgbench"
FLOOR_ASYNCPG = "floor-asyncpg"  # the floor with its jobs' transactions on asyncpg
PICK_SEQUENCE = "public.bench_pick"

RESET_EFFECTS: LiteralString = "TRUNCATE public.bench_effects"
COUNT_EFFECTS: LiteralString = "SELECT count(*) FROM public.bench_effects"
ID_RANGE: LiteralString = "SELECT min(id), max(id), count(*) FROM postbox.outbox"
CREATE_PICK: LiteralString = "CREATE SEQUENCE IF NOT EXISTS public.bench_pick"
SET_PICK: LiteralString = "SELECT setval('public.bench_pick', %(first)s, false)"
# Untimed set-up of the transaction-only script: every job running under the pretend worker's claim
# (what JOB_CLAIM_ATTEMPTS leaves: attempt 1, a lease, started and published).
MARK_CLAIMED: LiteralString = """
UPDATE postbox.outbox
   SET state = 'running', attempts = 1, claimed_by = 'pgbench', lease_until = now() + interval '1 hour',
       started_at = now(), published_at = coalesce(published_at, now()), publish_count = publish_count + 1
"""

_PICK = "SELECT nextval('public.bench_pick') AS id \\gset"
_EFFECT = "INSERT INTO public.bench_effects (job_id, n) VALUES (:id, 0);"
EFFECT_SCRIPT = f"{_PICK}\nBEGIN;\n{_EFFECT}\nCOMMIT;\n"  # the effect alone (with --floor)


def pool_size(concurrency: int) -> int:
    """The worker's pool size at ``concurrency`` (worker/worker.py: ``min(concurrency, 20) + 4``)."""
    return min(concurrency, 20) + 4


def scripts() -> tuple[str, str]:
    """(the job's transaction, claim + the job's transaction) as pgbench scripts over ``:id``."""
    statements = sql.active()
    job_id = "(:id)::int8"
    one = f"ARRAY[{job_id}]"
    claim = pgbench.render(
        statements.JOB_CLAIM_ATTEMPTS, {"ids": one, "entries": "NULL", "worker": f"'{WORKER}'", "lease": "3600"}
    )
    processed = pgbench.render(statements.PROCESSED_BEGIN, {"id": job_id})
    outcome = pgbench.render(statements.JOB_RECORD_SUCCESS, {"id": job_id, "worker": f"'{WORKER}'", "attempt": "1"})
    transaction = "\n".join(["BEGIN;", processed, _EFFECT, outcome, "COMMIT;"])
    return f"{_PICK}\n{transaction}\n", f"{_PICK}\n{claim}\n{transaction}\n"


def _prepare(conn: psycopg.Connection[Any], box: Sandbox, jobs: int, params: Params, claimed: bool) -> None:
    """Fresh outbox of ``jobs`` committed jobs, the pick sequence at the first id; claimed by the pretend worker."""
    outbox.reset(conn)
    conn.execute(RESET_EFFECTS)
    conn.commit()
    box.clean_redis_prefix()
    outbox.prefill(conn, TASK, jobs, params.batch)
    row = conn.execute(ID_RANGE).fetchone()
    assert row is not None
    first, last, count = row
    if count != jobs or last - first + 1 != jobs:
        raise RuntimeError(f"expected {jobs} consecutive job ids, found {count} in {first}..{last}")
    conn.execute(SET_PICK, {"first": first})
    if claimed:
        conn.execute(MARK_CLAIMED)
    conn.commit()


def _check_done(conn: psycopg.Connection[Any], jobs: int) -> None:
    found = outbox.states(conn)
    effects = outbox.scalar(conn, COUNT_EFFECTS)
    if found != {"succeeded": jobs} or effects != jobs:
        raise RuntimeError(f"expected {jobs} succeeded jobs and effects, found {found} and {effects} effects")


class PgQueuerEffect:
    """PgQueuer's handler writing the effect row (its best configuration), one drain per repetition."""

    def __init__(self, box: Sandbox, params: Params, jobs: int, pool: int, progress: Progress) -> None:
        from postbox_bench import peers
        from postbox_bench.peers import pgqueuer_peer
        from postbox_bench.peers.common import PeerConfig

        self.progress = progress
        self.jobs = jobs
        self.report = Report(machine={}, parameters={})  # a failed drain's note; the figure's label carries it
        cfg = PeerConfig(database_url=box.database("pgqueuer", migrated=False), concurrency=params.concurrency)
        peers.sync(pgqueuer_peer.install(cfg))
        with psycopg.connect(cfg.database_url) as conn:
            conn.execute(EFFECTS_DDL)
        self.database_url = cfg.database_url
        env = {**bench_env("", "", box.prefix), pgqueuer_peer.EFFECT_ENV: str(pool)}
        peer = peers.Peer("pgqueuer", pgqueuer_peer, cfg, env)
        self.drain = peers.PeerDrain(peer, replace(params, jobs=jobs), progress, self.report)
        self.drain.figure.scenario = SCENARIO
        self.drain.figure.key = "exactly_once.pgqueuer"
        self.drain.figure.paired = False  # the repetitions alternate with postbox's; the ratio is its own figure
        self.drain.figure.label = f"handler writing the effect row in its own transaction, pool {pool} ({jobs:,} jobs)"

    @property
    def figure(self) -> Figure:
        return self.drain.figure

    def _reset_effects(self) -> None:
        with psycopg.connect(self.database_url) as conn:
            conn.execute(RESET_EFFECTS)

    def warm_up(self) -> None:
        self._reset_effects()
        self.drain.warm_up()

    def rep(self, index: int) -> float | None:
        """This repetition's jobs/s, or None when the drain failed (the figure's label says why)."""
        self._reset_effects()
        before = len(self.figure.values)
        self.drain.rep(index)
        if len(self.figure.values) == before:
            if "[failed" not in self.figure.label:
                self.figure.label += f" [failed: {'; '.join(self.report.notes)}]"
            return None
        with psycopg.connect(self.database_url) as conn:
            effects = outbox.scalar(conn, COUNT_EFFECTS)
        if effects != self.jobs:
            raise RuntimeError(f"pgqueuer: expected {self.jobs} effect rows, found {effects}")
        return self.figure.values[-1]


def _pgqueuer_effect(box: Sandbox, params: Params, jobs: int, pool: int, progress: Progress) -> PgQueuerEffect | str:
    """The PgQueuer comparison, or why it cannot run (its package missing)."""
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
    except ImportError as exc:
        return f"PgQueuer not installed ({exc.name}): make bench (or pip install -e './bench[peers]')"
    return PgQueuerEffect(box, params, jobs, pool, progress)


def run(box: Sandbox, database_url: str, params: Params, progress: Progress) -> list[Figure]:
    clients = pool_size(params.concurrency)
    per_client = max(1, params.jobs // clients)
    jobs = per_client * clients  # every pgbench client does the same number of jobs
    n = f"{jobs:,} jobs"
    tx = Figure(
        SCENARIO,
        "exactly_once.pgbench_tx",
        f"pgbench: a job's transaction (processed + effect + outcome), {clients} clients, tx/s ({n})",
        "tx/s",
    )
    claim_tx = Figure(
        SCENARIO, "exactly_once.pgbench_claim_tx", f"pgbench: claim + the job's transaction, {clients} clients", "tx/s"
    )
    ours = Figure(
        SCENARIO,
        "exactly_once.postbox",
        f"postbox: ctx.transaction() jobs writing the effect, 1 worker process, concurrency {params.concurrency} ({n})",
        "jobs/s",
    )
    ratio = Figure(
        SCENARIO, "exactly_once.ratio", "postbox / pgbench job transaction (paired)", "x", target=Target(">=", 0.8)
    )
    ratio_claim = Figure(SCENARIO, "exactly_once.ratio_claim", "postbox / pgbench claim + transaction (paired)", "x")
    ratio_pgq = Figure(SCENARIO, "exactly_once.ratio_pgqueuer", "postbox / PgQueuer writing the effect (paired)", "x")
    peer = _pgqueuer_effect(box, params, jobs, clients, progress)
    if isinstance(peer, str):
        progress.say(f"exactly-once: {peer}; the PgQueuer figures skipped")
        ratio_pgq.label += f" [skipped: {peer}]"
        figures = [tx, claim_tx, ours, ratio, ratio_claim, ratio_pgq]
    else:
        figures = [tx, claim_tx, ours, peer.figure, ratio, ratio_claim, ratio_pgq]
    # The contract's shortest path, right after each postbox drain: (driver, its figure, its / PgQueuer's)
    floors: list[tuple[str, Figure, Figure | None]] = []
    if params.extra.get("floor"):
        drivers = [("psycopg", FLOOR, "floor")]
        if importlib.util.find_spec("asyncpg") is not None:
            drivers.append(("asyncpg", FLOOR_ASYNCPG, "floor_asyncpg"))
        for driver, system, name in drivers:
            figure = Figure(SCENARIO, ours.key, ours.label, "jobs/s", system=system, paired=True)
            figures.insert(figures.index(ours) + 1 + len(floors), figure)
            versus = None
            if not isinstance(peer, str):
                versus = Figure(
                    SCENARIO, f"exactly_once.{name}_pgqueuer", f"{system} / PgQueuer writing the effect (paired)", "x"
                )
                figures.append(versus)
            floors.append((driver, figure, versus))
    # With the floor: what PostgreSQL commits for the effect alone, as PgQueuer's handler's transaction is
    # (BEGIN; the row; COMMIT), and what the contract's statements cost beside it.
    effect_tx = Figure(
        SCENARIO,
        "exactly_once.pgbench_effect",
        f"pgbench: the effect row alone (BEGIN; INSERT; COMMIT), {clients} clients",
        "tx/s",
    )
    contract_share = Figure(
        SCENARIO, "exactly_once.pgbench_tx_effect", "pgbench: the job's transaction / the effect alone (paired)", "x"
    )
    pgbench_figures = [tx, claim_tx, ratio, ratio_claim]
    if floors:
        figures[figures.index(claim_tx) + 1 : figures.index(claim_tx) + 1] = [effect_tx, contract_share]
        pgbench_figures += [effect_tx, contract_share]
    have_pgbench = pgbench.available()
    if not have_pgbench:
        progress.say(f"exactly-once: {pgbench.MISSING}; pgbench figures skipped")
        for figure in pgbench_figures:
            figure.label += f" [skipped: {pgbench.MISSING}]"
    transaction_script, claim_script = scripts()
    env = bench_env(database_url, box.redis_url, box.prefix)
    variant = bench_worker.Variant("exactly_once.postbox", ours.label, TASK, 1)
    with psycopg.connect(database_url) as conn:
        conn.execute(EFFECTS_DDL)
        conn.execute(CREATE_PICK)
        conn.commit()
        bench_worker.drain_once(box, conn, env, variant, params, min(bench_worker.WARMUP_JOBS, jobs))
        if not isinstance(peer, str):
            peer.warm_up()
        progress.say("exactly-once warm-up drain done")
        for rep in range(params.repeat):
            if have_pgbench:
                for figure, script, claimed in ((tx, transaction_script, True), (claim_tx, claim_script, False)):
                    _prepare(conn, box, jobs, params, claimed)
                    result = pgbench.run(database_url, script, clients=clients, transactions=per_client)
                    _check_done(conn, jobs)
                    figure.values.append(result.tps)
                    progress.say(f"exactly-once rep {rep + 1}/{params.repeat} {figure.key}: {result.tps:,.0f} tx/s")
                if floors:
                    _prepare(conn, box, jobs, params, claimed=False)
                    result = pgbench.run(database_url, EFFECT_SCRIPT, clients=clients, transactions=per_client)
                    if (effects := outbox.scalar(conn, COUNT_EFFECTS)) != jobs:
                        raise RuntimeError(f"pgbench, the effect alone: expected {jobs} effect rows, found {effects}")
                    effect_tx.values.append(result.tps)
                    contract_share.values.append(tx.values[-1] / result.tps)
                    progress.say(f"exactly-once rep {rep + 1}/{params.repeat} {effect_tx.key}: {result.tps:,.0f} tx/s")
            conn.execute(RESET_EFFECTS)
            conn.commit()
            complete, _ = bench_worker.drain_once(box, conn, env, variant, params, jobs)
            if not complete:
                ours.label += " [a run timed out: rate of the jobs finished]"
            else:
                _check_done(conn, jobs)
            rate = outbox.span(conn, outbox.FINISH_SPAN).rate
            ours.values.append(rate)
            progress.say(f"exactly-once rep {rep + 1}/{params.repeat} postbox: {rate:,.0f} jobs/s")
            if have_pgbench:
                ratio.values.append(rate / tx.values[-1])
                ratio_claim.values.append(rate / claim_tx.values[-1])
            for driver, figure, _versus in floors:
                box.clean_redis_prefix()
                figure.values.append(
                    shortest.drain(database_url, box.redis_url, box.prefix, jobs, params.concurrency, TASK, driver)
                )
                progress.say(
                    f"exactly-once rep {rep + 1}/{params.repeat} {figure.system}: {figure.values[-1]:,.0f} jobs/s"
                )
            if not isinstance(peer, str) and (theirs := peer.rep(rep)) is not None:
                ratio_pgq.values.append(rate / theirs)
                progress.say(f"exactly-once rep {rep + 1}/{params.repeat} pgqueuer: {theirs:,.0f} jobs/s")
                for _driver, figure, versus in floors:
                    if versus is not None:
                        versus.values.append(figure.values[-1] / theirs)
        outbox.reset(conn)
        conn.execute(RESET_EFFECTS)
        conn.commit()
    box.clean_redis_prefix()
    return figures
