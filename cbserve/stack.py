"""What `cbserve up` runs: per cell a batcher and its workers, then the gateway and a Celery worker.

With `--cells N` (N > 1) the cells are `cell0` ... and every process is told its own (`CBSERVE_CELL`);
the gateway places requests in all of them (`GATEWAY_CELLS`). With several models each model has cells
of its own (cbserve/model_plans.py), whose workers load that model, and the gateway and the Celery
worker read every model from one models config. They share the one Redis: a cell's keys carry its
hash tag, which only a Redis Cluster needs, so cells run on a single Redis as they are.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from cbserve import processes
from cbserve.processes import Child
from common import streams


@dataclass
class Stack:
    run_dir: Path
    cells: list[str] = field(default_factory=lambda: [streams.DEFAULT_CELL])
    num_workers: dict[str, int] = field(default_factory=dict)  # per cell: the workers it starts
    services: list[Child] = field(default_factory=list)  # batchers, workers, gateway, celery
    redis_server: Child | None = None  # only when the launcher started it

    def children(self) -> list[Child]:
        return [*self.services, *([self.redis_server] if self.redis_server else [])]

    def first_exited(self) -> Child | None:
        return next((c for c in self.children() if c.exited()), None)

    def replace(self, old: Child, new: Child) -> Child:
        """`new` (a restarted `old`) takes `old`'s place."""
        if old is self.redis_server:
            self.redis_server = new
        else:
            self.services[self.services.index(old)] = new
        return new

    def stop(self, force: Callable[[], bool]) -> None:
        # Services first, so none of them sees Redis vanish mid-step; Redis last, flushing its AOF.
        processes.stop(self.services, force=force)
        if self.redis_server is not None:
            processes.stop([self.redis_server], force=force)


def cell_names(num_cells: int, env: Mapping[str, str]) -> list[str]:
    """One cell: the one the children inherit (CBSERVE_CELL, else the default); several: cell0, cell1..."""
    if num_cells == 1:
        return [streams.check_cell(env.get("CBSERVE_CELL") or streams.DEFAULT_CELL)]
    return [f"cell{i}" for i in range(num_cells)]


def celery_installed() -> bool:
    return importlib.util.find_spec("celery") is not None


def celery_args() -> list[str]:
    """`celery worker` for cbserve_celery: a threads pool (its tasks only wait on Redis), a node name
    of its own so two launchers on one host do not clash."""
    return [
        *["celery", "-A", "cbserve_celery.worker", "worker", "--pool", "threads", "--concurrency", "8"],
        *["--loglevel", "INFO", "--without-gossip", "--without-mingle", "-n", f"cbserve-{os.getpid()}@%h"],
    ]


@dataclass(frozen=True)
class ServiceArgs:
    """What every child is started with."""

    cell_models: dict[str, Path]  # per cell, in order: the model directory its workers load
    device: str
    redis_url: str
    host: str
    port: int
    celery: bool
    speculative_config: str | None = None  # SPECULATIVE_CONFIG for every service, when given
    gateways: int = 1  # gateway processes on the one port
    models_file: Path | None = None  # several models: the models config the gateway and Celery read
    lora_modules: list[str] = field(default_factory=list)  # the gateway's GATEWAY_LORA_MODULES
    runner: str | None = None  # every worker's WORKER_RUNNER, when given (vLLM's --runner)
    convert: str | None = None  # every worker's WORKER_CONVERT, when given (vLLM's --convert)


def worker_argv(model_dir: Path, args: ServiceArgs) -> list[str]:
    """`python -m gpu_worker`'s arguments for a worker of `model_dir`."""
    argv = ["gpu_worker", "--model", str(model_dir), "--device", args.device]
    for flag, value in (("--runner", args.runner), ("--convert", args.convert)):
        argv += [flag, value] if value else []
    return argv


def start_services(stack: Stack, args: ServiceArgs) -> None:
    env = {**os.environ, "REDIS_URL": args.redis_url, "PYTHONUNBUFFERED": "1"}
    if args.speculative_config is not None:
        env["SPECULATIVE_CONFIG"] = args.speculative_config
    if args.lora_modules:
        # Adapters the gateway serves need workers that run them (vLLM's --lora-modules implies it).
        env.setdefault("WORKER_ENABLE_LORA", "true")
    python = [sys.executable, "-m"]

    def start(name: str, argv: list[str], child_env: dict[str, str]) -> None:
        stack.services.append(
            processes.spawn(name, [*python, *argv], stack.run_dir / f"{name}.log", child_env)
        )

    if args.device == "cpu" and "WORKER_NUM_THREADS" not in env:
        # N workers each using every core would oversubscribe the CPU; share the cores out instead.
        num_workers = sum(stack.num_workers.values())
        env["WORKER_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, num_workers)))
    several = len(stack.cells) > 1
    for cell, model_dir in args.cell_models.items():
        cell_env = {**env, "CBSERVE_CELL": cell}
        prefix = f"{cell}-" if several else ""  # one cell keeps the names it always had
        start(f"{prefix}batcher", ["batcher"], cell_env)
        worker = worker_argv(model_dir, args)
        for i in range(stack.num_workers[cell]):
            start(f"{prefix}worker{i}", worker, cell_env)
    # The gateway and Celery place requests in the first cell; the gateway spreads them over all (with
    # several models, each model's over its own).
    front_env = {**env, "CBSERVE_CELL": stack.cells[0]}
    gateway = ["gateway", "--host", args.host, "--port", str(args.port)]
    celery_env = dict(front_env)
    if args.models_file is None:
        if several:
            front_env["GATEWAY_CELLS"] = ",".join(stack.cells)
        model_dir = args.cell_models[stack.cells[0]]
        gateway += ["--model", str(model_dir)]
        # Batch lines are rendered with the gateway's tokenizer: the worker gets the same model directory.
        celery_env["MODEL"] = str(model_dir)
    else:
        for name in (
            "MODEL",
            "GATEWAY_MODEL",
            "GATEWAY_CELLS",
            "CBSERVE_CELERY_MODEL",
        ):  # the file names them
            front_env.pop(name, None)
            celery_env.pop(name, None)
        front_env["GATEWAY_MODELS_CONFIG"] = str(args.models_file)
        celery_env["CBSERVE_CELERY_MODELS_CONFIG"] = str(args.models_file)
    if args.lora_modules:
        front_env["GATEWAY_LORA_MODULES"] = json.dumps(args.lora_modules)
    for name, argv, gateway_env in gateway_processes(
        gateway, args.gateways, front_env, stack.run_dir / "gateway-metrics"
    ):
        start(name, argv, gateway_env)
    if args.celery:
        start("celery", celery_args(), celery_env)


def gateway_processes(
    argv: list[str], count: int, env: dict[str, str], metrics_dir: Path
) -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, argv, env) of each gateway process: `gateway`, or `count` of them on one port
    (`--reuse-port`: the kernel deals connections out) whose /metrics add up every gateway's counts
    from prometheus_client's files in `metrics_dir`, emptied here."""
    if count == 1:
        return [("gateway", argv, env)]
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    shared_env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    return [(f"gateway{i}", [*argv, "--reuse-port"], shared_env) for i in range(count)]


def joined_workers(redis_url: str, cell: str, started_at: float) -> int:
    """Workers the cell's batcher has joined since this launch, read from its stats in Redis."""
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=2.0, socket_timeout=2.0)
    try:
        stats: Any = client.hmget(streams.cell_keys(cell).stats, ["num_workers", "updated_at"])
    except redis.RedisError:
        stats = [None, None]
    finally:
        client.close()
    num_workers, updated_at = stats
    # Stats left in a reused Redis by an earlier batcher must not count: only ones written since launch.
    fresh = updated_at is not None and float(updated_at) >= started_at
    return int(num_workers) if fresh and num_workers is not None else 0
