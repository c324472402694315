from __future__ import annotations

import pytest

from postbox import streams
from postbox.errors import SettingsError
from postbox.settings import load_settings


def test_database_url_falls_back_to_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """DATABASE_URL and REDIS_URL serve when postbox's own are unset (even in a shell that exports them)."""
    monkeypatch.delenv("POSTBOX_DATABASE_URL", raising=False)
    monkeypatch.delenv("POSTBOX_REDIS_URL", raising=False)
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("REDIS_URL", "redis://h:1/2")
    settings = load_settings()
    assert settings.database_url == "postgresql://u@h/db"
    assert settings.redis_url == "redis://h:1/2"


def test_prefixed_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/other")
    monkeypatch.setenv("POSTBOX_DATABASE_URL", "postgresql://u@h/mine")
    assert load_settings().database_url == "postgresql://u@h/mine"


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("POSTBOX_MAX_PAYLOAD_BYTES", "POSTBOX_VISIBILITY_TIMEOUT", "POSTBOX_TASKS"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.max_payload_bytes == 262144
    assert settings.visibility_timeout == 30
    assert settings.tasks == []


def test_lists_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTBOX_TASKS", "a.b, c.d")
    monkeypatch.setenv("POSTBOX_QUEUES", "mail,default")
    settings = load_settings()
    assert settings.tasks == ["a.b", "c.d"]
    assert settings.queues == ["mail", "default"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("POSTBOX_MAX_PAYLOAD_BYTES", "lots"),
        ("POSTBOX_MAX_PAYLOAD_BYTES", "0"),
        ("POSTBOX_CONCURRENCY", "-3"),
        ("POSTBOX_QUEUES", "Not A Queue"),
        ("POSTBOX_DATABASE_URL", "mysql://x"),
        ("POSTBOX_REDIS_URL", "http://x"),
        ("POSTBOX_LOG_LEVEL", "LOUD"),
        ("POSTBOX_REDIS_PREFIX", "has space"),
        ("POSTBOX_GC_THRESHOLD", "-1"),
        ("POSTBOX_GC_THRESHOLD", "often"),
    ],
)
def test_invalid_setting_is_named(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert name in str(info.value)


def test_missing_database_url_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POSTBOX_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(SettingsError, match="POSTBOX_DATABASE_URL"):
        load_settings().require_database_url()


def test_stream_keys_share_a_hash_tag_per_queue() -> None:
    keys = streams.queue_streams("postbox", "mail")
    assert keys[0] == "postbox:{mail}:p9" and keys[-1] == "postbox:{mail}:p0"
    assert all("{mail}" in key for key in keys)
    assert streams.parse_stream_key("postbox", "postbox:{mail}:p7") == ("mail", 7)
    with pytest.raises(ValueError):
        streams.stream_key("postbox", "mail", 10)
