"""Start the real services as processes (batcher, workers, gateway) against a test's redis-server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import redis

from common import streams
from common.redis_io.redis_conn import connect

if TYPE_CHECKING:
    import openai

ROOT = Path(__file__).resolve().parents[2]


def wait_for(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll `condition` until it holds; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Stack:
    redis_url: str
    model_dir: Path
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    base_url: str = ""
    redis_cluster: bool = False  # redis_url names the nodes of a Redis Cluster (REDIS_CLUSTER=true)

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        cluster = "true" if self.redis_cluster else "false"
        full_env = {
            **os.environ,
            "REDIS_URL": self.redis_url,
            "REDIS_CLUSTER": cluster,
            "PYTHONUNBUFFERED": "1",
        }
        full_env.update(env)
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=full_env, stdout=log, stderr=log)
        self.procs[name] = proc
        return proc

    def start_batcher(self, name: str = "batcher", **env: str) -> subprocess.Popen[bytes]:
        return self._spawn(name, ["batcher"], env)

    def start_worker(self, name: str = "worker0", **env: str) -> subprocess.Popen[bytes]:
        env = {"WORKER_NUM_THREADS": "1", **env}
        return self._spawn(name, ["gpu_worker", "--model", str(self.model_dir), "--device", "cpu"], env)

    def start_gateway(self, name: str = "gateway", **env: str) -> None:
        from harness.processes.redis_server import free_port

        port = free_port()
        self._spawn(
            name,
            ["gateway", "--host", "127.0.0.1", "--port", str(port), "--model", str(self.model_dir)],
            env,
        )
        self.base_url = f"http://127.0.0.1:{port}"

    def start_celery_worker(self, name: str = "celery", **env: str) -> subprocess.Popen[bytes]:
        """A real `celery worker` (threads pool) of cbserve_celery, with the model for batch lines (or
        the models config `env` names)."""
        if "CBSERVE_CELERY_MODELS_CONFIG" not in env:
            env = {"MODEL": str(self.model_dir), **env}
        args = ["celery", "-A", "cbserve_celery.worker", "worker", "--pool", "threads", "--concurrency", "8"]
        return self._spawn(name, [*args, "--loglevel", "INFO", "--without-gossip", "--without-mingle"], env)

    def start_all(
        self,
        num_workers: int = 1,
        batcher_env: dict[str, str] | None = None,
        worker_env: dict[str, str] | None = None,
        gateway_env: dict[str, str] | None = None,
    ) -> Stack:
        """A batcher, workers worker0 .. worker{num_workers - 1} and a gateway, all ready."""
        self.start_batcher(**(batcher_env or {}))
        for i in range(num_workers):
            self.start_worker(f"worker{i}", **(worker_env or {}))
        self.start_gateway(**(gateway_env or {}))
        self.wait_ready(num_workers=num_workers)
        return self

    def sdk(self, api_key: str = "unused", timeout: float = 120) -> openai.OpenAI:
        """An `openai` SDK client of the gateway that does not retry: a test sees every failure."""
        import openai

        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key, timeout=timeout, max_retries=0)

    def redis(self) -> redis.Redis:
        """A client of the stack's Redis (or Redis Cluster); the caller closes it."""
        return connect(self.redis_url, self.redis_cluster)

    def num_workers_joined(self, cell: str = streams.DEFAULT_CELL) -> int:
        with self.redis() as client:
            raw = client.hget(streams.cell_keys(cell).stats, "num_workers")
        return int(raw) if raw is not None else 0

    def stats(self, cell: str = streams.DEFAULT_CELL) -> dict[str, float]:
        with self.redis() as client:
            raw = client.hgetall(streams.cell_keys(cell).stats)
        return {k.decode(): float(v) for k, v in raw.items()}

    def stats_after(self, num_finished: int, timeout: float = 30.0) -> dict[str, float]:
        """The stats once the batcher has counted `num_finished` requests: a worker streams the last
        token before the batcher reads that step's result, so a client can finish first."""
        wait_for(
            lambda: self.stats().get("num_finished", 0) >= num_finished,
            timeout,
            f"the batcher to count {num_finished} finished requests",
        )
        return self.stats()

    def answers(self, path: str) -> bool:
        """Whether the gateway answers GET `path` with 200 now; raises if a service has died."""
        self.check_alive()
        try:
            return httpx.get(f"{self.base_url}{path}", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, num_workers: int, timeout: float = 90.0) -> None:
        wait_for(lambda: self.answers("/health"), timeout, "gateway /health to answer 200")
        wait_for(lambda: self.num_workers_joined() >= num_workers, timeout, f"{num_workers} workers to join")

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def running_stack(
    log_dir: Path,
    model_dir: Path,
    batcher_env: dict[str, str] | None = None,
    celery_env: dict[str, str] | None = None,
    worker_env: dict[str, str] | None = None,
    **gateway_env: str,
) -> Iterator[Stack]:
    """Its own redis-server, a batcher (with `batcher_env`), one worker (with `worker_env`) and a
    gateway (with `gateway_env`), and a Celery worker if `celery_env` is given, all ready."""
    from harness.processes.redis_server import redis_server

    with redis_server(log_dir) as url:
        stack = Stack(redis_url=url, model_dir=model_dir, log_dir=log_dir)
        try:
            if celery_env is not None:  # starts with the others, so that it is ready with them
                stack.start_celery_worker(**celery_env)
            stack.start_all(batcher_env=batcher_env, worker_env=worker_env, gateway_env=gateway_env)
            yield stack
        finally:
            stack.stop()


def module_stack(name: str, model_fixture: str = "tiny_model_dir", **env: Any) -> Any:
    """A module-scoped `stack` fixture: `running_stack` (with `env`'s keyword arguments) on the model
    that `model_fixture` names, its logs under a temporary folder called `name`. A module assigns it:
    `stack = module_stack("so-stack")`; conftest's `client` is an SDK client of it."""

    @pytest.fixture(scope="module")
    def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
        model_dir: Path = request.getfixturevalue(model_fixture)
        with running_stack(tmp_path_factory.mktemp(name), model_dir, **env) as s:
            yield s

    return stack


@contextlib.contextmanager
def cluster_stack(cluster_url: str, model_dir: Path, log_dir: Path) -> Iterator[Stack]:
    """A Stack (nothing started yet) of services on a Redis Cluster; every process stopped after."""
    stack = Stack(redis_url=cluster_url, model_dir=model_dir, log_dir=log_dir, redis_cluster=True)
    try:
        yield stack
    finally:
        stack.stop()
