"""The sample project's conftest: pytest-django's database, postbox's helpers on Django's connection."""

import pytest
from django.db import connection


@pytest.fixture
def conn(db):
    """Django's connection inside the test's transaction (pytest-django's ``db`` fixture rolls it back)."""
    return connection
