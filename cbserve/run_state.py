"""What the runs of `cbserve up` in one checkout share, so that an exported REDIS_URL stays true.

A Redis the launcher starts keeps the port it got the first time (`redis-port`) and its password
(`redis-password`, readable by its owner only) in the state directory (`./.cbserve`, or the
`--run-dir` when one is given): the next run starts it at the same URL, unless someone else took
the port meanwhile (then a new one is remembered). Each ready run writes `env` there too, a file to
`source` that exports CBSERVE_URL and REDIS_URL for the README's examples.
"""

from __future__ import annotations

import os
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

_PORT, _PASSWORD, _ENV = "redis-port", "redis-password", "env"


def write_private(path: Path, text: str) -> Path:
    """`text` in a file only its owner can read (created so: never readable by others for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


@dataclass(frozen=True)
class RunState:
    dir: Path

    def redis_port(self) -> int | None:
        """The port the last started Redis listened on, if any was remembered."""
        try:
            return int((self.dir / _PORT).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def remember_redis_port(self, port: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / _PORT).write_text(f"{port}\n")

    def redis_password(self) -> str:
        """The started Redis' password: the one remembered, else a new one (then remembered)."""
        path = self.dir / _PASSWORD
        if path.is_file():
            password = path.read_text().strip()
            if password:
                return password
        password = secrets.token_urlsafe(24)
        write_private(path, password + "\n")
        return password

    def write_env(self, cbserve_url: str, redis_url: str) -> Path:
        """`source`-able exports of the gateway's and Redis' URLs (private: it holds the password)."""
        exports = {"CBSERVE_URL": cbserve_url, "REDIS_URL": redis_url}
        lines = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in exports.items())
        return write_private(self.dir / _ENV, lines)
