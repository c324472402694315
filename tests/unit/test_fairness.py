"""Fair queues' pure parts: the key a producer writes, declarations refused."""

from __future__ import annotations

import pytest

from postbox import fairness
from postbox.errors import InvalidOptionError


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ('{"tenant_id": "acme"}', "acme"),
        ('{"tenant_id": 42}', "42"),
        ('{"tenant_id": -7}', "-7"),
        ('{"other": 1}', ""),
        ('{"tenant_id": null}', ""),
        ('{"tenant_id": 1.5}', None),  # the relay decides (PostgreSQL's text of a number)
        ('{"tenant_id": true}', None),
        ('{"tenant_id": {"id": 1}}', None),
    ],
)
def test_key_of_agrees_with_the_relay_or_leaves_the_job_to_it(args: str, key: str | None) -> None:
    assert fairness.key_of(args, "tenant_id") == key


@pytest.mark.parametrize(
    ("queue", "by", "window", "field"),
    [
        ("", "t", None, "queue"),
        ("UPPER", "t", None, "queue"),
        ("q", "x" * 201, None, "by"),
        ("q", "t", 1_000_001, "window"),
        ("q", "t", 2.5, "window"),
    ],
)
def test_a_bad_declaration_names_its_field(queue: str, by: str, window: object, field: str) -> None:
    with pytest.raises(InvalidOptionError) as info:
        fairness.validate(queue, by, window)  # type: ignore[arg-type]
    assert info.value.field == field


def test_a_good_declaration_passes() -> None:
    fairness.validate("reports", "tenant_id", None)
    fairness.validate("reports", "tenant_id", 1)
