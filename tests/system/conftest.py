"""Fixtures the system tests share; a test file's own fixture of the same name wins."""

from tests.harness.fleet import effects_db, fleet  # noqa: F401 - fixtures, used by name
