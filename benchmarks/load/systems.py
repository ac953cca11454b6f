"""Starting and stopping the servers a comparison launches, each in its own process session.

`launched(system, model_dir, log_dir)` starts a system's processes, waits until it answers (health
200, and for cbserve until the batcher has seen every worker), yields its base URL and stops every
process it started on the way out, newest first: SIGTERM to the process's own session, SIGKILL after
a grace period. Logs go to `log_dir/<system>-<process>.log`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.baselines.gguf import ensure_gguf
from benchmarks.baselines.llama_launch import LlamaServerOptions, server_command
from benchmarks.load.specs import LaunchSpec, SystemSpec

ROOT = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 20.0
POLL_INTERVAL_S = 0.2
# /proc counts CPU time in clock ticks (USER_HZ): its resolution.
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProcessGroup:
    """The processes of one launched system."""

    def __init__(self, name: str, log_dir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log_dir = log_dir
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.redis_url: str | None = None  # set by the cbserve starter, for tools that read its stats
        log_dir.mkdir(parents=True, exist_ok=True)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env, **(env or {})}
        with open(self.log_path(name), "wb") as log:
            # Its own session, so a Ctrl-C at the terminal reaches only the benchmark, which then stops
            # the servers in order; and so stop() can signal a server together with its children.
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs[name] = proc

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{self.name}-{name}.log"

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = self.log_path(name).read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name}: {name} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for proc in reversed(self.procs.values()):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs.values()):
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def cpu_seconds(group: ProcessGroup) -> dict[str, float]:
    """User + system CPU seconds of each process of the group so far (Linux /proc; {} elsewhere).

    On a machine with fewer cores than busy processes the iteration period is bound by their sum,
    not by any one of them: this shows which service's share to cut.
    """
    seconds = {}
    for name, proc in group.procs.items():
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds[name] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S  # utime, stime
    return seconds


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, group: ProcessGroup) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        group.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{group.name}: timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _start_static(group: ProcessGroup, launch: LaunchSpec, model: str, port: int) -> None:
    argv = [sys.executable, "-m", "benchmarks.baselines.static_server", "--model", model, "--port", str(port)]
    for key, value in launch.options.items():
        argv += [_flag(key), str(value)]
    group.spawn("static", argv)


def _start_inprocess(group: ProcessGroup, launch: LaunchSpec, model: str, port: int) -> None:
    """Our scheduler and model runner in one process (no Redis), behind the static server's front."""
    argv = [sys.executable, "-m", "benchmarks.baselines.static_server", "--engine", "inprocess"]
    argv += ["--model", model, "--port", str(port)]
    for key, value in launch.options.items():
        argv += [_flag(key), str(value)]
    group.spawn("inprocess", argv)


def _start_transformers(group: ProcessGroup, launch: LaunchSpec, model: str, port: int) -> None:
    exe = shutil.which("transformers", path=str(Path(sys.executable).parent)) or shutil.which("transformers")
    if exe is None:
        raise RuntimeError("`transformers` CLI not found; pip install 'transformers[serving]'")
    options = dict(launch.options)
    cb = str(options.pop("continuous_batching", "true")).lower() in ("1", "true", "yes")
    argv = [exe, "serve", model, "--host", "127.0.0.1", "--port", str(port)]
    argv.append("--continuous-batching" if cb else "--no-continuous-batching")
    for key, value in options.items():
        argv += [_flag(key), str(value)]
    group.spawn("transformers", argv)


def start_redis(group: ProcessGroup) -> str:
    """A throwaway redis-server on a free port (no persistence), once it answers; its URL."""
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not on PATH; cbserve needs one")
    redis_port = free_port()
    data_dir = group.log_dir / f"{group.name}-redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    redis_args = ["--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    group.spawn("redis", [binary, *redis_args, "--dir", str(data_dir)])
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    group.redis_url = redis_url
    client = redis.Redis.from_url(redis_url)

    def redis_up() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_until(redis_up, 30, "redis-server", group)
    finally:
        client.close()
    return redis_url


def _start_cbserve(group: ProcessGroup, launch: LaunchSpec, model: str, port: int) -> None:
    """redis-server on a free port, then per cell a batcher and its workers, then the gateway, as
    `cbserve up` does: `workers` per cell; with `cells` > 1 they are cell0, cell1, ... behind the one
    gateway (its GATEWAY_CELL_POLICY, if set in `env`, picks how it places requests); `gateways`
    > 1 starts that many on the one port."""
    import redis

    from cbserve.stack import cell_names, gateway_processes
    from common import streams

    redis_url = start_redis(group)
    client = redis.Redis.from_url(redis_url)
    env = {"REDIS_URL": redis_url}
    if "num_threads" in launch.options:
        env["WORKER_NUM_THREADS"] = str(launch.options["num_threads"])
    num_workers = int(launch.options.get("workers", 1))
    device = str(launch.options.get("device", "cpu"))
    cells = cell_names(int(launch.options.get("cells", 1)), {**os.environ, **group.env})
    several = len(cells) > 1
    for cell in cells:
        cell_env = {**env, "CBSERVE_CELL": cell}
        prefix = f"{cell}-" if several else ""  # one cell keeps the log names it always had
        group.spawn(f"{prefix}batcher", [sys.executable, "-m", "batcher"], cell_env)
        worker = [sys.executable, "-m", "gpu_worker", "--model", model, "--device", device]
        for i in range(num_workers):
            group.spawn(f"{prefix}worker{i}", worker, cell_env)
    gateway = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port), "--model", model]
    front_env = {**env, "CBSERVE_CELL": cells[0]}
    if several:
        front_env["GATEWAY_CELLS"] = ",".join(cells)
    num_gateways = int(launch.options.get("gateways", 1))
    metrics_dir = group.log_dir / f"{group.name}-gateway-metrics"
    for name, argv, gateway_env in gateway_processes(gateway, num_gateways, front_env, metrics_dir):
        group.spawn(name, argv, gateway_env)

    def workers_joined() -> bool:
        joined = [client.hget(streams.cell_keys(cell).stats, "num_workers") for cell in cells]
        return all(raw is not None and int(raw) >= num_workers for raw in joined)

    wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health"), launch.startup_timeout_s, "/health", group)
    wait_until(
        workers_joined, launch.startup_timeout_s, f"{num_workers} worker(s) to join each batcher", group
    )
    client.close()


def _start_llama_server(group: ProcessGroup, launch: LaunchSpec, model: str, port: int) -> None:
    """llama.cpp's server on the model's GGUF of the spec's outtype (converted once, then cached)."""
    options = LlamaServerOptions.from_options(launch.options)
    if not Path(options.binary).is_file():
        raise RuntimeError(f"{options.binary} not found: bash benchmarks/baselines/llama_server.sh builds it")
    group.spawn("llama-server", server_command(options, ensure_gguf(model, options.outtype), port))


def _start_command(group: ProcessGroup, launch: LaunchSpec, model: str, port: int) -> None:
    argv = [a.format(port=port, model=model, python=sys.executable) for a in launch.command]
    group.spawn("server", argv)


STARTERS: dict[str, Callable[[ProcessGroup, LaunchSpec, str, int], None]] = {
    "static": _start_static,
    "inprocess": _start_inprocess,
    "cbserve": _start_cbserve,
    "transformers": _start_transformers,
    "llama-server": _start_llama_server,
    "command": _start_command,
}


@contextlib.contextmanager
def launched(system: SystemSpec, model: str, log_dir: Path) -> Iterator[str]:
    """Yields the base URL of `system`: started here when it has a launch spec, else as given."""
    launch = system.launch
    if launch is None:
        assert system.base_url is not None
        yield system.base_url
        return
    port = int(launch.options.get("port") or 0) or free_port()
    base_url = system.base_url or f"http://127.0.0.1:{port}"
    group = ProcessGroup(system.name, log_dir, launch.env)
    try:
        STARTERS[launch.kind](group, launch, model, port)
        health = f"{base_url.rstrip('/')}{launch.health_path}"
        wait_until(lambda: http_ok(health), launch.startup_timeout_s, f"{health} to answer 200", group)
        yield base_url
    finally:
        group.stop()
