"""docker-compose.yml and the Dockerfile, checked without Docker.

Every postbox service's command must be a real ``postbox`` subcommand (or, for the
example's services, a ``stagedoor`` one) whose own argument parser accepts it, and
every environment variable a postbox container gets must be a real setting (postbox's, or the
example's own: examples/settings.py); the infrastructure services stay private.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from postbox.app.cli import COMMANDS, resolve
from postbox.settings_doc import all_env_names
from postbox_examples import settings as example_settings
from postbox_examples.cli import COMMANDS as EXAMPLE_COMMANDS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
INFRA = {"postgres", "redis"}


class Parsed(BaseException):
    """Raised in place of running the command once its arguments parsed."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__()
        self.namespace = namespace


class Refused(BaseException):
    """Raised in place of argparse's SystemExit (which some mains catch and turn into a code)."""


class Rejected(Exception):
    """The subcommand's parser refused the arguments."""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def postbox_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if name not in INFRA}


def parse_command(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """Run the subcommand's own argparse on argv (nothing else): its namespace, or Rejected."""
    assert argv[0] in ("postbox", "stagedoor"), argv
    name, rest = argv[1], argv[2:]
    commands = COMMANDS if argv[0] == "postbox" else EXAMPLE_COMMANDS
    assert name in commands, f"{name!r} is not a {argv[0]} subcommand"
    run = resolve(name) if argv[0] == "postbox" else example_command(name)
    original = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        try:
            result = original(self, args, namespace)
        except SystemExit:
            raise Refused() from None
        raise Parsed(result)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    try:
        run(rest)
    except Parsed as parsed:
        return parsed.namespace
    except Refused:
        raise Rejected(" ".join(argv)) from None
    finally:
        monkeypatch.undo()
    raise AssertionError(f"{argv[0]} {name} did not parse its arguments with argparse")


def example_command(name: str) -> Callable[[Sequence[str]], int]:
    module_name, _, func_name = EXAMPLE_COMMANDS[name][0].partition(":")
    func: Callable[[Sequence[str]], int] = getattr(importlib.import_module(module_name), func_name)
    return func


def test_the_services_are_all_there(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "redis", "migrate", "api", "relay", "worker", "provider"}
    services = compose["services"]
    assert services["relay"]["deploy"]["replicas"] == 2
    assert services["worker"]["deploy"]["replicas"] >= 1
    assert services["migrate"]["restart"] == "no"
    for name in ("api", "relay", "worker"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}


def test_every_command_is_a_real_postbox_subcommand(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = {name: parse_command(svc["command"], monkeypatch) for name, svc in postbox_services(compose).items()}
    assert [compose["services"][n]["command"][:3] for n in ("migrate", "api", "relay", "worker", "provider")] == [
        ["stagedoor", "migrate"],  # postbox's schema, then the example's own
        ["stagedoor", "api", "run"],  # postbox's API plus the example's order routes
        ["postbox", "relay", "run"],
        ["postbox", "worker", "run"],
        ["stagedoor", "provider", "run"],
    ]
    assert vars(parsed["migrate"]) == {}  # `stagedoor migrate` takes no options
    assert parsed["api"].api_command == "run" and parsed["api"].host == "0.0.0.0"
    assert parsed["relay"].command == "run"
    assert parsed["worker"].command == "run"
    assert parsed["provider"].command == "run" and parsed["provider"].port == 8025


def test_the_command_check_rejects_bad_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Rejected):
        parse_command(["postbox", "api", "run", "--hots", "0.0.0.0"], monkeypatch)
    with pytest.raises(Rejected):
        parse_command(["postbox", "worker", "walk"], monkeypatch)
    with pytest.raises(Rejected):
        parse_command(["stagedoor", "provider", "run", "--port", "eighty"], monkeypatch)
    with pytest.raises(AssertionError, match="not a postbox subcommand"):
        parse_command(["postbox", "serve"], monkeypatch)
    with pytest.raises(AssertionError, match="not a postbox subcommand"):
        parse_command(["postbox", "provider", "run"], monkeypatch)  # the example's, not an operator's


def test_every_environment_variable_is_a_real_setting(compose: dict[str, Any]) -> None:
    known = all_env_names() | example_settings.env_names()
    for name, svc in postbox_services(compose).items():
        env = svc.get("environment", {})
        assert isinstance(env, dict), f"{name}: use the mapping form for environment"
        unknown = sorted(set(env) - known)
        assert unknown == [], f"{name}: not postbox's settings nor the example's: {unknown}"
        assert env["POSTBOX_DATABASE_URL"].startswith("postgresql://")
        assert env["POSTBOX_REDIS_URL"].startswith("redis://")
    worker_env = compose["services"]["worker"]["environment"]
    assert worker_env["POSTBOX_TASKS"].split(",")[0] in {"postbox_examples.stagedoor.tasks"}
    assert {"POSTBOX_BOGUS", "POSTGRES_PASSWORD", "POSTBOX_STREAM_MAXLEN"}.isdisjoint(known)  # the check can fail
    # The example's settings are not postbox's: docs/configuration.md documents the product only.
    assert {"POSTBOX_PROVIDER_URL", "POSTBOX_BLOB_DIR", "POSTBOX_STATE_DIR"} <= known - all_env_names()


def test_the_tasks_module_named_in_compose_exists(compose: dict[str, Any]) -> None:
    import importlib.util

    for module in compose["services"]["worker"]["environment"]["POSTBOX_TASKS"].split(","):
        assert importlib.util.find_spec(module) is not None, module


def test_postgres_and_redis_publish_no_port_and_redis_persists(compose: dict[str, Any]) -> None:
    for name in INFRA:
        assert "ports" not in compose["services"][name], f"{name} must not publish a port"
    command = compose["services"]["redis"]["command"]
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["--appendonly"] == "yes"
    assert flags["--maxmemory-policy"] == "noeviction"
    assert compose["services"]["postgres"]["image"].startswith("postgres:18")


def test_the_api_has_a_readiness_healthcheck(compose: dict[str, Any]) -> None:
    test = compose["services"]["api"]["healthcheck"]["test"]
    assert "/ready" in " ".join(test)


def dockerfile_stages() -> list[list[str]]:
    stages: list[list[str]] = []
    for line in DOCKERFILE.read_text().splitlines():
        if re.match(r"^FROM\s", line):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_the_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M)
    assert base is not None and base.group(1).endswith("-slim")
    final = "\n".join(stages[-1])
    users = re.findall(r"^USER\s+(\S+)", final, re.M)
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert "COPY --from=build /opt/venv /opt/venv" in final
    for tool in ("gcc", "build-essential", "apt-get install", "pip install"):
        assert tool not in final, f"the final stage must not carry {tool}"
