"""`make run` as a user runs it in a terminal: started from the repository root, ready once it prints
`cbserve is ready`, its environment file sourced, stopped with Ctrl-C (SIGINT to its process group)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.processes.redis_server import free_port
from harness.processes.services import ROOT, wait_for
from harness.user.readme_venv import user_env

READY_TIMEOUT_S = 300.0  # Redis, the batcher, the worker loading the demo model, the gateway, Celery
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class MadeRun:
    venv: Path
    env: dict[str, str]  # a user's environment after `source <run dir>/env`
    base_url: str
    log: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def sourced(env_file: Path) -> dict[str, str]:
    """CBSERVE_URL and REDIS_URL as a shell that sources `env_file` has them."""
    script = f'source "{env_file}" && printf "%s\\n%s" "$CBSERVE_URL" "$REDIS_URL"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    cbserve_url, redis_url = out.split("\n")
    return {"CBSERVE_URL": cbserve_url, "REDIS_URL": redis_url}


@contextlib.contextmanager
def make_run(venv: Path, run_dir: Path) -> Iterator[MadeRun]:
    """`make run VENV=<venv>` on a free port with its own run directory (not the checkout's .cbserve)
    and a Redis it starts from redis-server on PATH; stopped as Ctrl-C stops it."""
    log = run_dir.parent / f"{run_dir.name}.out"
    args = f"--port {free_port()} --run-dir {run_dir} --redis binary"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["make", "run", f"VENV={venv}", f"ARGS={args}"],
            cwd=ROOT,
            env={**user_env(), "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    try:

        def ready() -> bool:
            text = log.read_text(errors="replace")
            if proc.poll() is not None:
                raise AssertionError(f"make run exited with {proc.returncode}:\n{text[-4000:]}")
            return "cbserve is ready" in text

        wait_for(ready, READY_TIMEOUT_S, "make run to print 'cbserve is ready'", interval=0.2)
        env = sourced(run_dir / "env")
        yield MadeRun(venv=venv, env=env, base_url=env["CBSERVE_URL"], log=log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
