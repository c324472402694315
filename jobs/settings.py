"""Settings from the environment (prefix ``POSTBOX_``), validated at start.

Every setting is a field of :class:`Settings`; ``docs/configuration.md`` is
checked against this class by a test, so the two cannot drift.  Nothing here
reads the environment at import time: call :func:`load_settings`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from typing import Annotated, Any

from pydantic import AliasChoices, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from postbox import encryption, schema
from postbox.encryption import Keyring
from postbox.errors import SettingsError

QUEUE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
REDIS_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class Settings(BaseSettings):
    """All of postbox's settings. Field docs are the reference documentation."""

    model_config = SettingsConfigDict(
        env_prefix="POSTBOX_",
        extra="ignore",
        validate_default=True,
        populate_by_name=True,
        hide_input_in_errors=True,  # an error never repeats a value: it may be a key or a password
    )

    # --- connections -----------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("POSTBOX_DATABASE_URL", "DATABASE_URL", "database_url"),
        description="PostgreSQL URL (also read from DATABASE_URL). Unset: the demo starts an embedded server.",
    )
    redis_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("POSTBOX_REDIS_URL", "REDIS_URL", "redis_url"),
        description="Redis URL (also read from REDIS_URL). Unset: the demo starts an embedded server.",
    )
    redis_cluster: bool = Field(
        default=False,
        description=(
            "POSTBOX_REDIS_URL is a node of a Redis Cluster (or several, comma-separated, tried in turn at "
            "start): connect with the cluster client, which discovers the other nodes. Relays, workers and the "
            "API refuse to start on a cluster node without it (see docs/operations.md, Redis Cluster)."
        ),
    )
    start_timeout: float = Field(
        default=15.0,
        ge=0,
        le=3600,
        description=(
            "Seconds a process (relay, worker, api, migrate, the admin commands) waits at start for PostgreSQL and "
            "Redis to answer before it gives up with one line naming the URL (exit 2; the admin commands exit 1). "
            "A refusal (a missing database, a wrong password) ends the wait at once."
        ),
    )
    gc_threshold: int = Field(
        default=10_000,
        ge=0,
        le=1_000_000,
        description=(
            "The garbage collector's young-generation threshold in the relay, worker and API processes, set once "
            "they have started, after the objects made at start are frozen out of the collector's passes "
            "(CPython's default is 700; a job's allocations set it off every few dozen jobs, and nearly nothing "
            "is collected: docs/benchmarks.md). 0 leaves the interpreter's collector as it is. Only those "
            "commands change it (through manage.py too); a Worker or Relay run inside an application's own "
            "process is never changed."
        ),
    )
    schema_name: str = Field(
        default="postbox",
        validation_alias=AliasChoices("POSTBOX_SCHEMA", "schema_name"),
        description=(
            "PostgreSQL schema that holds every postbox table, function and its migration version table. "
            "Producers, relays, workers and the API of one system must agree on it."
        ),
    )
    redis_prefix: str = Field(
        default="postbox",
        description="Prefix of every Redis key postbox writes (streams, epoch, heartbeats).",
    )

    # --- producer --------------------------------------------------------------
    max_payload_bytes: int = Field(
        default=262_144, ge=1, description="Largest accepted job payload (JSON-encoded args), in bytes."
    )
    max_queue_depth: int = Field(
        default=0,
        ge=0,
        description=(
            "API refuses enqueues (429) when a queue holds this many waiting jobs (exact: checked under a "
            "per-queue lock); 0 = no limit."
        ),
    )

    # --- relay -----------------------------------------------------------------
    poll_interval: float = Field(
        default=0.5, gt=0, le=60, description="Relay poll interval in seconds (NOTIFY wakes it sooner)."
    )
    relay_batch_size: int = Field(default=1000, ge=1, le=50_000, description="Rows the relay publishes per batch.")
    relay_mark_delay: float = Field(
        default=0.025,
        ge=0,
        le=1,
        description=(
            "Seconds the relay may hold back marking a part batch published (docs/relay.md#deferred-marks): "
            "a worker usually claims the job first, so one mark covers many jobs and mostly finds them "
            "claimed; 0 marks every batch at once."
        ),
    )
    fair_window: int = Field(
        default=2000,
        ge=1,
        le=1_000_000,
        description=(
            "Jobs a fair queue keeps published and unfinished at most, unless its declaration says "
            "(docs/job-control.md#fair-queues): at least the queue's worker concurrency; a newly "
            "waiting key's job starts after at most about this many of the queue's jobs."
        ),
    )
    fair_poll_interval: float = Field(
        default=0.1,
        gt=0,
        le=10,
        description=(
            "Seconds between the relay's refills of a fair queue's window while jobs wait in it "
            "(a quarter of it after a fill that found the window half empty)."
        ),
    )
    relay_lock_key: int = Field(
        default=0x706F7374626F78, description="Advisory lock key that elects the leading relay."
    )
    relay_metrics_port: int = Field(
        default=0, ge=0, le=65535, description="Prometheus port of a relay process; 0 = off."
    )
    relay_session_timeout: float = Field(
        default=5.0,
        ge=1,
        le=3600,
        description=(
            "Seconds of silence after which PostgreSQL ends a relay's lock session (idle_session_timeout), "
            "so a frozen leader loses the lock and a standby takes over."
        ),
    )
    republish_rate: int = Field(
        default=5000, ge=1, description="Most rows per second the relay republishes after Redis loss."
    )

    # --- worker ----------------------------------------------------------------
    tasks: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated modules whose @task handlers are loaded."
    )
    queues: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated queues a worker consumes; empty = the tasks' queues."
    )
    concurrency: int = Field(default=10, ge=1, le=10_000, description="Jobs a worker process runs at once.")
    worker_processes: int = Field(
        default=1,
        ge=1,
        le=256,
        description=(
            "Worker processes `postbox worker run` starts (its --processes). Above 1 the command supervises that "
            "many workers: it forwards SIGTERM/SIGINT to them and restarts one that dies (docs/worker.md)."
        ),
    )
    visibility_timeout: float = Field(
        default=30.0, gt=0, description="Seconds before an unacknowledged entry may be reclaimed by another worker."
    )
    drain_timeout: float = Field(default=30.0, ge=0, description="Seconds a stopping worker waits for in-flight jobs.")
    retry_base_delay: float = Field(default=1.0, ge=0, description="Base of the exponential retry backoff, seconds.")
    retry_max_delay: float = Field(default=300.0, ge=0, description="Cap of the retry backoff, seconds.")
    retry_jitter: float = Field(
        default=0.2, ge=0, le=1, description="Relative jitter of the retry backoff (0.2 = ±20%)."
    )
    heartbeat_interval: float = Field(
        default=5.0, gt=0, description="Seconds between worker heartbeats (and lease renewals)."
    )
    unknown_task_grace: float = Field(
        default=600.0,
        ge=0,
        description=(
            "Seconds a worker hands back a job whose task it does not know, or whose args its handler refuses "
            "(for a worker that can run it, during a rolling deploy) before sending it to the dead letters; "
            "counted from the first time that worker saw the job. 0 = dead letters at once."
        ),
    )
    worker_metrics_port: int = Field(
        default=0, ge=0, le=65535, description="Prometheus port of a worker process; 0 = off."
    )

    # --- api -------------------------------------------------------------------
    api_host: str = Field(default="127.0.0.1", description="Address the API binds.")
    api_port: int = Field(default=8000, ge=1, le=65535, description="Port the API binds.")
    api_key: str | None = Field(
        default=None,
        description=(
            "The API key (X-API-Key). Destructive operations and reading job args need it; unset or empty: "
            "destructive operations are refused (403) and args redacted, unless POSTBOX_API_INSECURE=true."
        ),
    )
    api_key_for_all: bool = Field(
        default=False, description="When true, every /api/v1 call needs X-API-Key (needs POSTBOX_API_KEY)."
    )
    api_insecure: bool = Field(
        default=False,
        description=(
            "Without POSTBOX_API_KEY, serve destructive operations anyway (audited as api:anonymous) and show "
            "job args. Local development only: the API warns at start."
        ),
    )
    api_public_args: bool = Field(
        default=False,
        description="When true, job args and results are readable without the key (GET /jobs/{id}, /dlq/{id}...).",
    )
    api_session_ttl: float = Field(
        default=43_200,
        gt=0,
        le=31 * 86_400,
        description=(
            "Seconds a dashboard login lasts (a server-side session; logout, revocation and a new "
            "POSTBOX_API_KEY end it sooner)."
        ),
    )
    api_auth_burst: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description=(
            "Wrong keys (X-API-Key, dashboard login) one client may send before it is throttled: then every "
            "attempt with a key answers 429 with Retry-After until a try is regained."
        ),
    )
    api_auth_refill: float = Field(
        default=10.0,
        gt=0,
        le=86_400,
        description="Seconds in which a throttled client regains one try (10 = at most 6 wrong keys a minute).",
    )
    api_trusted_proxies: str = Field(
        default="",
        description=(
            "Comma-separated addresses or networks of reverse proxies whose X-Forwarded-For and "
            "X-Forwarded-Proto the API believes (the client's address for throttling and audit, https for "
            "the session cookie). Empty: none."
        ),
    )
    api_max_in_flight: int = Field(
        default=64,
        ge=0,
        le=100_000,
        description=(
            "Most /api/v1 requests one API process serves at once; the next answers 503 OVERLOADED with "
            "Retry-After at once instead of queueing. 0 = no limit."
        ),
    )
    api_max_loop_lag: float = Field(
        default=0.25,
        ge=0,
        le=60,
        description=(
            "Seconds the API's event loop may run late (out of CPU) before /api/v1 requests answer 503 "
            "OVERLOADED at once; 0 = off."
        ),
    )
    api_pool_size: int = Field(default=10, ge=1, le=1000, description="PostgreSQL connections of one API process.")
    api_pool_timeout: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="Seconds a request waits for a free PostgreSQL connection before answering 503 with Retry-After.",
    )
    api_body_timeout: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description=(
            "Seconds a request's whole body may take to arrive; a slower or short body gets 408. "
            "Every route's body is also limited to POSTBOX_MAX_PAYLOAD_BYTES + 64 KiB (413)."
        ),
    )

    # --- encryption ------------------------------------------------------------
    encryption_keys: SecretStr | None = Field(
        default=None,
        description=(
            "Keys of encrypted tasks (@task(encrypted=True)): kid:base64key pairs, comma-separated, each key 32 "
            "random bytes (postbox encryption new-key). The first one encrypts, every one decrypts: rotate by "
            "putting a new key first, then postbox encryption reencrypt, then dropping the old one "
            "(docs/job-control.md). A secret: never shown in logs, errors or settings dumps. Unset: encrypted "
            "tasks cannot be enqueued or run."
        ),
    )

    # --- retention -------------------------------------------------------------
    retention_finished_days: float = Field(
        default=7.0, ge=0, description="Days finished (succeeded, cancelled, expired) jobs are kept."
    )
    retention_processed_days: float = Field(default=7.0, ge=0, description="Days processed_jobs rows are kept.")
    prune_batch_size: int = Field(default=1000, ge=1, description="Rows deleted per pruning batch.")
    prune_interval: float = Field(
        default=300.0,
        ge=0,
        description="Seconds between the leading relay's pruning rounds; 0 = off (run `postbox prune` from cron).",
    )

    # --- logging ---------------------------------------------------------------
    log_json: bool = Field(default=False, description="Write logs as JSON lines.")
    log_level: str = Field(default="INFO", description="Log level: DEBUG, INFO, WARNING, ERROR.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment, then a Django project's settings (:func:`framework_sources`)."""
        return init_settings, env_settings, dotenv_settings, file_secret_settings, *framework_sources(settings_cls)

    @field_validator("tasks", "queues", mode="before")
    @classmethod
    def _split_csv(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("queues")
    @classmethod
    def _check_queues(cls, value: list[str]) -> list[str]:
        for queue in value:
            if not QUEUE_NAME_RE.match(queue):
                raise ValueError(f"invalid queue name {queue!r}: must match {QUEUE_NAME_RE.pattern}")
        return value

    @field_validator("schema_name")
    @classmethod
    def _check_schema(cls, value: str) -> str:
        try:
            return schema.validate(value)
        except SettingsError as exc:
            raise ValueError(str(exc).split(": ", 1)[1]) from None

    @field_validator("redis_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not REDIS_PREFIX_RE.match(value):
            raise ValueError(f"must match {REDIS_PREFIX_RE.pattern}")
        return value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
            raise ValueError("must be a postgresql:// URL")
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        parts = [] if value is None else [part.strip() for part in value.split(",")]
        if any(not part.startswith(("redis://", "rediss://", "unix://")) for part in parts):
            raise ValueError("must be a redis://, rediss:// or unix:// URL (several, comma-separated: cluster nodes)")
        return value

    @field_validator("api_key", mode="before")
    @classmethod
    def _blank_key_is_none(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("api_key_for_all")
    @classmethod
    def _key_for_all_needs_a_key(cls, value: bool, info: ValidationInfo) -> bool:
        if value and not info.data.get("api_key"):
            raise ValueError("needs POSTBOX_API_KEY: with no key, every call would be open")
        return value

    @field_validator("api_trusted_proxies")
    @classmethod
    def _check_proxies(cls, value: str) -> str:
        networks = []
        for part in (part.strip() for part in value.split(",")):
            if not part:
                continue
            try:
                networks.append(str(ipaddress.ip_network(part, strict=False)))
            except ValueError:
                raise ValueError(f"{part!r} is not an IP address or network (e.g. 10.0.0.0/8)") from None
        return ",".join(networks)

    @field_validator("encryption_keys")
    @classmethod
    def _check_encryption_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or encryption.is_blank(value.get_secret_value()):
            return None
        try:
            Keyring.parse(value.get_secret_value())
        except SettingsError as exc:  # its message names key ids, never a key
            raise ValueError(str(exc).split(": ", 1)[1]) from None
        return value

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    def require_database_url(self) -> str:
        if not self.database_url:
            raise SettingsError("POSTBOX_DATABASE_URL (or DATABASE_URL) is not set")
        return libpq_url(self.database_url)

    def require_redis_url(self) -> str:
        if not self.redis_url:
            raise SettingsError("POSTBOX_REDIS_URL (or REDIS_URL) is not set")
        return self.redis_url


def framework_sources(settings_cls: type[BaseSettings]) -> tuple[PydanticBaseSettingsSource, ...]:
    """Settings from a Django project with ``postbox.django`` installed, below the environment.

    Only when the process is a Django one (``DJANGO_SETTINGS_MODULE`` set, or Django
    already imported): a process without Django never imports it.
    """
    if not os.environ.get("DJANGO_SETTINGS_MODULE") and "django.conf" not in sys.modules:
        return ()
    from postbox.django.conf import settings_source

    source = settings_source(settings_cls)
    return () if source is None else (source,)


def libpq_url(url: str) -> str:
    """The URL as libpq (psycopg) accepts it: SQLAlchemy's driver suffix removed."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment; raise :class:`SettingsError` naming each bad setting.

    The settings' schema becomes this process's schema, unless :func:`postbox.schema.use` chose one;
    their encryption keys its keyring, unless :func:`postbox.encryption.use_keys` set one.
    """
    try:
        settings = Settings(**overrides)
        schema.follow_settings(settings.schema_name)
        encryption.follow_settings(settings.encryption_keys)
        return settings
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            name = field if field.isupper() else f"POSTBOX_{field.upper()}"
            problems.append(f"{name}: {error['msg']}")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
