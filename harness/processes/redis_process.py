"""A redis-server that a test can stop and start again on the same port and data dir (AOF everysec)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from harness.processes.redis_server import free_port


@dataclass
class RedisProcess:
    data_dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start (or restart) and wait until it answers PING, its AOF loaded."""
        binary = shutil.which("redis-server")
        assert binary, "redis-server must be on PATH"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir)]
        args += ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen([binary, *args], stdout=log, stderr=log)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:  # refused, or BusyLoadingError while the AOF loads
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        self.stop(signal.SIGKILL)
                        raise
                    time.sleep(0.01)
        finally:
            client.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM flushes the AOF and exits; SIGKILL leaves what the OS already had of it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)
        self.proc = None

    def aof_incr_file(self) -> Path:
        """The AOF file that the running server appends to (Redis 7 multi-part AOF)."""
        (path,) = (self.data_dir / "appendonlydir").glob("*.incr.aof")
        return path


@contextlib.contextmanager
def running_redis(data_dir: Path) -> Iterator[RedisProcess]:
    """A RedisProcess started in `data_dir`, killed when the block ends."""
    proc = RedisProcess(data_dir)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop(signal.SIGKILL)
