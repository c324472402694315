"""The schema revision a worker needs: the order of revisions and the check's verdicts."""

from __future__ import annotations

import pytest
from alembic.script import ScriptDirectory

from postbox import migrate, revision
from postbox.errors import SchemaOutdatedError


def test_the_required_revision_is_the_newest_migration() -> None:
    assert revision.REQUIRED == migrate.head_revision()


def test_every_migration_is_numbered_one_after_the_one_it_revises() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config("postgresql://unused"))
    chain = list(script.walk_revisions())  # newest first
    assert chain, "no migrations found"
    for rev in chain:
        place = revision.order(rev.revision)
        assert place is not None, f"{rev.revision}: revisions are named NNNN_words"
        previous = rev.down_revision
        assert isinstance(previous, str | None)
        assert (revision.order(previous) if previous else 0) == place - 1, rev.revision


def test_the_required_revision_and_newer_ones_pass() -> None:
    revision.check("0006_job_transaction", "0006_job_transaction")
    revision.check("0007_later_work", "0006_job_transaction")  # a rolling deploy: newer code migrated it


@pytest.mark.parametrize(
    ("current", "says"),
    [
        (None, "the database has no postbox schema (revision 0006_job_transaction needed): run `postbox migrate`"),
        (
            "0005_fenced_success",
            "the database's postbox schema is at revision 0005_fenced_success; this postbox needs"
            " 0006_job_transaction: run `postbox migrate`",
        ),
        ("0001_initial", "needs 0006_job_transaction"),
        ("some_hand_made_id", "unknown revision 'some_hand_made_id' (0006_job_transaction needed)"),
    ],
)
def test_an_older_missing_or_unknown_revision_is_refused_naming_both(current: str | None, says: str) -> None:
    with pytest.raises(SchemaOutdatedError) as refused:
        revision.check(current, "0006_job_transaction")
    assert says in str(refused.value)


def test_order_reads_only_four_digit_prefixes() -> None:
    assert revision.order("0006_job_transaction") == 6
    assert revision.order("0012_x") == 12
    assert revision.order("6_job") is None
    assert revision.order("0006") is None
    assert revision.order("abcd_x") is None
