"""POSTBOX_ENCRYPTION_KEYS is a setting: validated at load, named in errors, never shown; an encrypted task
cannot be scheduled (issue 32, item 6)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from postbox import encryption
from postbox.errors import SettingsError
from postbox.settings import Settings, load_settings

KEY1 = base64.b64encode(b"\x01" * 32).decode()
KEY2 = base64.b64encode(b"\x02" * 32).decode()
SHORT = base64.b64encode(b"\x03" * 16).decode()


@pytest.fixture(autouse=True)
def fresh_keyring(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("POSTBOX_ENCRYPTION_KEYS", raising=False)
    encryption.use_keys(None)
    yield
    encryption.use_keys(None)


def test_the_keys_are_a_setting_that_becomes_the_keyring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTBOX_ENCRYPTION_KEYS", f" k2:{KEY2} , k1:{KEY1} ")
    settings = load_settings()
    assert settings.encryption_keys is not None
    assert encryption.keyring().kids == ("k2", "k1")
    assert encryption.keyring().current == "k2"
    # Never shown: not in the settings' repr, str, dump or JSON dump, nor in the keyring's repr.
    shown = [repr(settings), str(settings), str(settings.model_dump()), settings.model_dump_json()]
    shown.append(repr(encryption.keyring()))
    for text in shown:
        assert KEY1 not in text and KEY2 not in text
    assert "'**********'" in settings.model_dump_json().replace('"', "'")


def test_settings_given_in_code_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTBOX_ENCRYPTION_KEYS", f"env:{KEY1}")
    load_settings(encryption_keys=f"code:{KEY2}")
    assert encryption.keyring().kids == ("code",)
    encryption.use_keys(f"chosen:{KEY1}")  # use_keys() wins over any settings loaded afterwards
    load_settings()
    assert encryption.keyring().kids == ("chosen",)


@pytest.mark.parametrize("blank", ["", "  ", " , "])
def test_blank_is_unset_and_an_encrypted_task_then_has_no_key(monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    monkeypatch.setenv("POSTBOX_ENCRYPTION_KEYS", blank)
    assert load_settings().encryption_keys is None
    assert encryption.keyring_or_none() is None
    with pytest.raises(encryption.EncryptionError, match="no encryption key: set POSTBOX_ENCRYPTION_KEYS"):
        encryption.keyring()


def test_loaded_settings_without_keys_leave_no_key_even_if_the_environment_changes_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    load_settings()
    monkeypatch.setenv("POSTBOX_ENCRYPTION_KEYS", f"late:{KEY1}")
    assert encryption.keyring_or_none() is None  # the process follows the settings it started with
    encryption.use_keys(None)  # forgetting them: a producer that never loaded settings reads the variable
    assert encryption.keyring().kids == ("late",)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (f"short:{SHORT}", "key 'short' must be 32 bytes (AES-256), base64-encoded; got 16"),
        ("k:not base64!", "key 'k' is not valid base64"),
        (f"k1:{KEY1},k1:{KEY2}", "key id 'k1' is given twice"),
        (KEY1, "key #1 is not kid:base64key (no ':')"),
        (f"k1:{KEY1},{KEY2}:k2", "the id of key #2 must match"),  # swapped: the key is not echoed as an id
        (f"bad id:{KEY1}", "the id of key #1 must match"),
    ],
)
def test_a_bad_value_is_a_settings_error_naming_the_setting_never_the_key(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("POSTBOX_ENCRYPTION_KEYS", value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    text = str(info.value)
    assert text.startswith("invalid settings: POSTBOX_ENCRYPTION_KEYS: ")
    assert message in text
    for secret in (KEY1, KEY2, SHORT, KEY1[:20], KEY2[:20]):
        assert secret not in text
    with pytest.raises(ValidationError) as raw:  # built directly, pydantic's own error hides the input too
        Settings(encryption_keys=value)
    assert all(secret not in str(raw.value) for secret in (KEY1, KEY2, SHORT))
    with pytest.raises(SettingsError) as parsed:
        encryption.Keyring.parse(value)
    assert all(secret not in str(parsed.value) for secret in (KEY1, KEY2, SHORT))


def test_an_encrypted_task_cannot_be_scheduled_and_nothing_is_declared() -> None:
    from postbox.errors import InvalidOptionError
    from postbox.periodic import ScheduleBook, periodic
    from postbox.registry import Registry, task

    registry, book = Registry(), ScheduleBook()

    @task(registry=registry, encrypted=True)
    def secret(ctx: Any, card: str = "") -> None: ...

    with pytest.raises(InvalidOptionError, match="task 'secret' is encrypted: a schedule's jobs are enqueued by the"):
        periodic(secret, every=60, registry=registry, book=book)
    assert len(book) == 0


def test_an_encrypted_task_cannot_partition_its_limits_by_an_argument() -> None:
    from postbox.errors import InvalidOptionError
    from postbox.registry import Registry, task

    registry = Registry()
    with pytest.raises(InvalidOptionError, match="encrypted arguments cannot partition its limits"):

        @task(registry=registry, encrypted=True, concurrency=2, partition_by="customer")
        def sealed(ctx: Any, customer: str) -> None: ...

    assert registry.names() == []
