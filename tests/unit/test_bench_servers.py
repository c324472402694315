"""`postbox-bench` picks its servers: both URLs, or neither (embedded servers), never one."""

from __future__ import annotations

import pytest

from postbox_bench import cli

URL_VARIABLES = ("POSTBOX_DATABASE_URL", "DATABASE_URL", "POSTBOX_REDIS_URL", "REDIS_URL")


@pytest.mark.parametrize(
    "variable, value",
    [("POSTBOX_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/postgres"), ("REDIS_URL", "redis://127.0.0.1:1/0")],
)
def test_bench_with_one_url_only_refuses_in_one_line_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, value: str
) -> None:
    for name in URL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    started: list[object] = []
    monkeypatch.setattr(cli, "_embedded", lambda progress: started.append(progress))
    monkeypatch.setattr(cli.signal, "signal", lambda signum, handler: None)  # keep pytest's SIGTERM handler

    assert cli.main(["enqueue", "--quiet"]) == 2

    captured = capsys.readouterr()
    assert captured.err == "postbox-bench: set both POSTBOX_DATABASE_URL and POSTBOX_REDIS_URL, or neither\n"
    assert captured.out == ""
    assert started == []
