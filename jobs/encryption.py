"""Arguments encrypted at rest: a task declared ``@task(encrypted=True)`` stores its jobs' args sealed.

The producer seals the validated JSON of the arguments with AES-256-GCM (the
``cryptography`` package's authenticated encryption: a forged, truncated or
swapped ciphertext fails to open, it never decodes to garbage), under the
first key of the keyring, with the task's name as associated data (a sealed
payload moved to another task does not open). What the outbox, its backups,
the streams, the API and the dashboard hold is an envelope::

    {"$postbox_encrypted": {"v": 1, "kid": "2026-12", "nonce": "<base64>", "data": "<base64>"}}

Only the worker opens it, right before calling the handler. Keys come from
``POSTBOX_ENCRYPTION_KEYS``: ``kid:base64key`` pairs, comma-separated, the
first one encrypts and every one decrypts — rotation without downtime is: put
the new key first everywhere (old ones stay), then ``postbox encryption
reencrypt`` seals the stored rows under it, then drop the old key. A key the
process does not have, or a payload that does not open, is an
:class:`EncryptionError` naming the key id. docs/job-control.md.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from postbox.errors import PostboxError, SettingsError

if TYPE_CHECKING:
    from pydantic import SecretStr

ENVELOPE = "$postbox_encrypted"
ENV_VAR = "POSTBOX_ENCRYPTION_KEYS"
KID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
NONCE_BYTES = 12


class EncryptionError(PostboxError):
    """A sealed payload could not be opened (no such key here, or it does not authenticate), or sealing failed."""


@dataclass(frozen=True)
class Keyring:
    """Named AES keys; the first one seals, every one opens.

    Its repr and every message it raises name key ids only, never a key (nor a
    key id that does not look like one: it may be a key typed in its place).
    """

    keys: tuple[tuple[str, bytes], ...] = field(repr=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise SettingsError(f"{ENV_VAR}: no key given")
        seen: set[str] = set()
        for n, (kid, key) in enumerate(self.keys, 1):
            if not KID_RE.match(kid):
                raise SettingsError(f"{ENV_VAR}: the id of key #{n} must match {KID_RE.pattern}")
            if kid in seen:
                raise SettingsError(f"{ENV_VAR}: key id {kid!r} is given twice")
            if len(key) != 32:
                raise SettingsError(
                    f"{ENV_VAR}: key {kid!r} must be 32 bytes (AES-256), base64-encoded; got {len(key)}"
                )
            seen.add(kid)

    def __repr__(self) -> str:
        return f"Keyring(kids={self.kids!r})"

    @property
    def kids(self) -> tuple[str, ...]:
        """The key ids, the encrypting one first."""
        return tuple(kid for kid, _ in self.keys)

    @classmethod
    def parse(cls, text: str) -> Keyring:
        """``kid:base64key[,kid:base64key...]``; raises :class:`SettingsError` naming the setting (not the keys)."""
        pairs = []
        for n, part in enumerate((p.strip() for p in text.split(",") if p.strip()), 1):
            kid, sep, encoded = part.partition(":")
            kid = kid.strip()
            if not sep:
                raise SettingsError(f"{ENV_VAR}: key #{n} is not kid:base64key (no ':')")
            if not KID_RE.match(kid):
                raise SettingsError(f"{ENV_VAR}: the id of key #{n} must match {KID_RE.pattern}")
            try:
                key = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise SettingsError(f"{ENV_VAR}: key {kid!r} is not valid base64") from None
            pairs.append((kid, key))
        return cls(tuple(pairs))

    @property
    def current(self) -> str:
        return self.keys[0][0]

    def seal(self, task: str, plaintext: bytes) -> str:
        """The envelope (JSON text) of ``plaintext`` under the current key, bound to ``task``."""
        AESGCM = _aesgcm()
        kid, key = self.keys[0]
        nonce = secrets.token_bytes(NONCE_BYTES)
        data = AESGCM(key).encrypt(nonce, plaintext, task.encode())
        return orjson.dumps({ENVELOPE: {"v": 1, "kid": kid, "nonce": _b64(nonce), "data": _b64(data)}}).decode()

    def open(self, task: str, envelope: Mapping[str, Any]) -> bytes:
        """The plaintext of an envelope (the parsed JSON object); :class:`EncryptionError` when it cannot open."""
        AESGCM = _aesgcm()
        from cryptography.exceptions import InvalidTag

        sealed = envelope.get(ENVELOPE)
        if not isinstance(sealed, Mapping) or sealed.get("v") != 1:
            raise EncryptionError("not a postbox encryption envelope (version 1)")
        kid = sealed.get("kid")
        key = dict(self.keys).get(kid) if isinstance(kid, str) else None
        if key is None:
            have = ", ".join(k for k, _ in self.keys)
            raise EncryptionError(
                f"the args are sealed with key {kid!r}, which this process does not have ({ENV_VAR} holds: {have})"
            )
        try:
            nonce = base64.b64decode(sealed["nonce"], validate=True)
            data = base64.b64decode(sealed["data"], validate=True)
            return AESGCM(key).decrypt(nonce, data, task.encode())
        except (InvalidTag, KeyError, TypeError, ValueError, binascii.Error):
            raise EncryptionError(
                f"the args sealed with key {kid!r} do not open for task {task!r}: wrong key, or altered"
            ) from None


def keyless_warning(encrypted_tasks: list[str]) -> str | None:
    """What a process that runs these encrypted tasks says at start when it has no key (None: it has one)."""
    if not encrypted_tasks or keyring_or_none() is not None:
        return None
    return (
        f"encrypted tasks {', '.join(sorted(encrypted_tasks))} cannot run here: no encryption key"
        f" (set {ENV_VAR}); their jobs are handed back, and dead after POSTBOX_UNKNOWN_TASK_GRACE"
    )


def result_context(job_id: int) -> str:
    """What a kept result is bound to (its associated data): its job, so it opens for that job's result only."""
    return f"postbox-result:{job_id}"


def open_result(job_id: int, value: Any) -> Any:
    """A kept result as the handler returned it: opened when sealed and this process has its key.

    Without the key, or when it does not open, the envelope stays as it is (never a guess).
    """
    keys = keyring_or_none() if is_sealed(value) else None
    if keys is None:
        return value
    try:
        return orjson.loads(keys.open(result_context(job_id), value))
    except EncryptionError:
        return value


def open_args(task: str, value: Any) -> Any:
    """A job's args as enqueued: opened when sealed and this process has the key, else ``value`` as it is.

    Raises :class:`EncryptionError` when the key is here and they do not open (altered, another task's):
    the caller says so and shows the envelope, never a guess.
    """
    keys = keyring_or_none() if is_sealed(value) else None
    if keys is None:
        return value
    return orjson.loads(keys.open(task, value))


def is_sealed(value: Any) -> bool:
    return isinstance(value, Mapping) and ENVELOPE in value


def key_id(value: Any) -> str | None:
    """The key id of an envelope (None: not one)."""
    if not is_sealed(value):
        return None
    sealed = value[ENVELOPE]
    return sealed.get("kid") if isinstance(sealed, Mapping) else None


def new_key() -> str:
    """A fresh random AES-256 key, base64-encoded (``postbox encryption new-key``)."""
    return _b64(secrets.token_bytes(32))


_configured: Keyring | None = None
_followed: Keyring | None = None
_following = False


def use_keys(keys: str | Keyring | None) -> None:
    """Set this process's keyring (tests, or an application configuring it in code); None: back to the settings."""
    global _configured, _followed, _following
    _configured = Keyring.parse(keys) if isinstance(keys, str) else keys
    _followed, _following = None, False
    _from_env.cache_clear()


def follow_settings(keys: SecretStr | None) -> None:
    """The loaded settings' ``encryption_keys`` become this process's keyring (:func:`postbox.settings.load_settings`).

    Unless :func:`use_keys` set one. The setting is validated by then: a bad value stopped the process at start.
    """
    global _followed, _following
    text = "" if keys is None else keys.get_secret_value()
    _followed, _following = (None if is_blank(text) else Keyring.parse(text)), True


def keyring() -> Keyring:
    """This process's keyring: the one set by :func:`use_keys`, else the settings' ``POSTBOX_ENCRYPTION_KEYS``.

    A process that has not loaded its settings (a producer in an application)
    reads the variable from the environment, checked the same way. Raises
    :class:`EncryptionError` when there is none, naming the setting.
    """
    found = keyring_or_none()
    if found is None:
        raise EncryptionError(f"no encryption key: set {ENV_VAR} (kid:base64key, the first one encrypts)")
    return found


def keyring_or_none() -> Keyring | None:
    """:func:`keyring`, or None when this process has no key."""
    if _configured is not None:
        return _configured
    if _following:
        return _followed
    return _from_env(os.environ.get(ENV_VAR, ""))


@functools.lru_cache(maxsize=4)
def _from_env(text: str) -> Keyring | None:
    return None if is_blank(text) else Keyring.parse(text)


def is_blank(text: str) -> bool:
    """Whether a value of the setting gives no key at all (empty, spaces, commas): unset."""
    return not text.replace(",", "").strip()


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise EncryptionError(
            "encrypted tasks need the cryptography package: pip install 'postbox[encryption]'"
        ) from None
    return AESGCM


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
