"""The pure parts of `bench exactly-once`, `bench rest` and `bench growth`: scripts, options, spreads."""

from __future__ import annotations

import re

import pytest

from postbox_bench import cli, exactly_once, growth, pgbench


def test_pgbench_render_substitutes_every_parameter_and_refuses_a_missing_one() -> None:
    assert pgbench.render("SELECT %(a)s, 100 %% 7", {"a": ":id"}) == "SELECT :id, 100 % 7;"
    with pytest.raises(ValueError, match="no value for: b"):
        pgbench.render("SELECT %(a)s, %(b)s", {"a": "1"})


def test_exactly_once_scripts_run_the_workers_statements_on_one_picked_job() -> None:
    transaction, with_claim = exactly_once.scripts()
    for script in (transaction, with_claim):
        assert script.startswith("SELECT nextval('public.bench_pick') AS id \\gset\n")
        assert "%(" not in script
        assert "INSERT INTO public.bench_effects (job_id, n) VALUES (:id, 0);" in script
        assert re.search(r"BEGIN;\nSELECT \"postbox\".begin_processed\(\(:id\)::int8::int8\);\n", script)
        # The worker's in-transaction success, fenced on the pretend worker's attempt 1, just before COMMIT.
        assert re.search(r"record_success\(\(:id\)::int8::int8, 'pgbench'::text, 1::int4\);\nCOMMIT;\n$", script)
    assert "claim_attempts(" not in transaction and "claim_attempts(" in with_claim
    assert with_claim.index("claim_attempts(") < with_claim.index("BEGIN;")  # the claim is its own transaction


def test_exactly_once_uses_as_many_pgbench_clients_as_the_worker_pool_holds() -> None:
    assert [exactly_once.pool_size(c) for c in (1, 4, 20, 50)] == [5, 8, 24, 24]


def test_bench_cli_knows_the_issue_20_scenarios_and_their_options() -> None:
    for name in ("exactly-once", "rest", "growth"):
        assert name in cli.EXTRA_SCENARIOS and name not in cli.SCENARIOS
    args = cli.parser().parse_args(["growth", "--growth", "steady,drain", "--minutes", "3", "--big", "1000"])
    assert (args.growth, args.minutes, args.big, args.steady_rate) == (("steady", "drain"), 3, 1000, 1000)
    assert cli.parser().parse_args(["growth"]).growth == growth.PARTS
    rest = cli.parser().parse_args(["rest"])
    assert (rest.clients, rest.requests) == (10, 3000)
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["growth", "--growth", "drain,nope"])


def test_growth_spreads_jobs_over_every_queue_and_priority() -> None:
    seen = {(o["queue"], o["priority"]) for o in map(growth.spread, range(1000))}
    assert len(seen) == len(growth.QUEUES) * growth.PRIORITIES == 1000
