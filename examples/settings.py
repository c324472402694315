"""The examples' own settings: Stagedoor's mail provider, blob store and claim expiry, the demo's folder.

postbox's settings (:class:`postbox.settings.Settings`) are the product's and document nothing an
example alone reads. These come from the same environment with the same ``POSTBOX_`` prefix, so one
environment (docker-compose.yml, the demo's child processes, a system test's) configures both: each
class reads its own names and ignores the other's.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from postbox.errors import SettingsError


class ExampleSettings(BaseSettings):
    """What the Stagedoor example and the demo read besides postbox's settings."""

    model_config = SettingsConfigDict(env_prefix="POSTBOX_", extra="ignore", validate_default=True)

    state_dir: str = Field(
        default="",
        description="Folder of the demo's embedded servers and the local blob store; empty = ~/.local/state/postbox.",
    )
    provider_url: str = Field(
        default="http://127.0.0.1:8025", description="Base URL of the mail provider the Stagedoor jobs call."
    )
    provider_timeout: float = Field(default=5.0, gt=0, description="Seconds before a provider call times out.")
    blob_dir: str = Field(default="", description="Folder of the local blob store; empty = <state_dir>/blobs.")
    stagedoor_claim_ttl: float = Field(
        default=120.0,
        gt=0,
        description="Seconds after which an unsent Stagedoor email claim counts as stale and may be taken over.",
    )


def env_names() -> set[str]:
    """The environment variables these settings read."""
    return {f"POSTBOX_{name.upper()}" for name in ExampleSettings.model_fields}


def load_example_settings(**overrides: Any) -> ExampleSettings:
    """Read the examples' settings from the environment; raise :class:`SettingsError` naming each bad one."""
    try:
        return ExampleSettings(**overrides)
    except ValidationError as exc:
        problems = [f"POSTBOX_{str(error['loc'][0]).upper()}: {error['msg']}" for error in exc.errors()]
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
