"""`cbserve up`: Redis, per cell a batcher and N workers, the gateway and a Celery worker as child
processes (which ones: cbserve/stack.py; which models in which cells: cbserve/model_plans.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from pydantic import ValidationError

from cbserve import processes
from cbserve.defaults import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_RESTART_WINDOW_S,
    RedisMode,
)
from cbserve.model_plans import ModelPlan, plan_models, write_models_file
from cbserve.processes import Child
from cbserve.redis_resolver import RedisUnavailable, redact, resolve
from cbserve.restarts import RestartBudget
from cbserve.run_state import RunState
from cbserve.stack import ServiceArgs, Stack, celery_installed, joined_workers, start_services
from cbserve.startup_progress import StartupProgress
from common.lora_modules import parse_lora_modules
from common.speculative_config import SpeculativeConfig


class LaunchError(RuntimeError):
    """Startup cannot go on; the message says why (and what to change)."""


@dataclass
class UpOptions:
    model: list[str] | None = None  # directories or hub ids; None: MODEL, else the demo model
    models_config: Path | None = None  # several models from a file (common/models_config.py)
    lora_modules: list[str] | None = None  # vLLM's --lora-modules, for the gateway
    workers: int = 1  # per cell
    cells: int = 1  # each a batcher and its workers; the gateway places requests in all of them
    gateways: int = 1  # gateway processes sharing the port (SO_REUSEPORT)
    host: str = "127.0.0.1"
    port: int = 8000
    redis: RedisMode = "auto"
    device: str = "auto"
    run_dir: Path | None = None
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    celery: bool = True  # a Celery worker for the Batch API and the Celery task, when installed
    max_restarts: int = DEFAULT_MAX_RESTARTS  # per service within DEFAULT_RESTART_WINDOW_S (restarts.py)
    speculative_config: str | None = None  # SPECULATIVE_CONFIG (JSON) for every service
    runner: str | None = None  # vLLM's --runner for every worker (WORKER_RUNNER)
    convert: str | None = None  # vLLM's --convert for every worker (WORKER_CONVERT)


def say(message: str) -> None:
    print(f"cbserve: {message}", flush=True)


# ----- before anything starts ------------------------------------------------------------------------
def resolve_model(spec: str) -> Path:
    """A local model directory, or a hub id fetched (or found in the hub cache) as one.

    The gateway needs a directory (it reads tokenizer.json without transformers), so a hub id is
    resolved here once and the same directory goes to the gateway and every worker.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        return path.resolve()
    looks_like_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not path.exists()
    if not looks_like_hub_id:
        raise LaunchError(
            f"no model directory at {path}. Pass --model DIR (a Hugging Face model directory with "
            "config.json, safetensors weights and tokenizer.json) or a hub id, or set MODEL"
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise LaunchError(f"{spec!r} is not a directory, and huggingface_hub is not installed") from exc
    say(f"fetching {spec} from the Hugging Face hub (or its local cache)")
    try:
        patterns = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt"]
        return Path(snapshot_download(spec, allow_patterns=patterns))
    except Exception as exc:  # the hub client raises many kinds; all mean the same here
        raise LaunchError(f"cannot fetch model {spec!r}: {exc}") from exc


def resolve_device(choice: str, env: Mapping[str, str]) -> tuple[str, str]:
    """(device, why). `auto` asks torch only when an NVIDIA driver is present, to keep CPU starts fast."""
    if choice != "auto":
        return choice, f"--device {choice}"
    if env.get("WORKER_DEVICE") in ("cpu", "cuda"):
        return env["WORKER_DEVICE"], "WORKER_DEVICE is set"
    if shutil.which("nvidia-smi") is None:
        return "cpu", "no nvidia-smi on PATH"
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        found = (
            subprocess.run([sys.executable, "-c", probe], timeout=120, capture_output=True).returncode == 0
        )
    except subprocess.TimeoutExpired:
        found = False
    if found:
        return "cuda", "torch sees a CUDA device"
    return "cpu", "nvidia-smi exists but this torch build sees no CUDA device"


def check_speculative_config(text: str | None) -> None:
    """Refuse a --speculative-config the services would refuse, before starting any of them."""
    if text is None:
        return
    try:
        SpeculativeConfig.model_validate_json(text)
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'json'}: {e['msg']}" for e in exc.errors())
        raise LaunchError(f"--speculative-config: {errors}") from None


def check_port_free(host: str, port: int) -> None:
    """Fail before loading anything if the gateway could not bind, rather than after a long model load."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            s.bind(address)
    except OSError as exc:
        raise LaunchError(f"cannot listen on {host}:{port} ({exc}); pass another --port") from exc


def connect_url(host: str, port: int) -> str:
    """The URL clients on this machine use; a wildcard bind is reached through loopback."""
    connect_host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in connect_host:
        connect_host = f"[{connect_host}]"
    return f"http://{connect_host}:{port}"


def new_run_dir(base: Path | None) -> Path:
    run_dir = base or Path.cwd() / ".cbserve" / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir.resolve()


# ----- signals ---------------------------------------------------------------------------------------
class StopSignals:
    """SIGINT / SIGTERM / SIGHUP ask for a clean stop; a second one means stop waiting and kill."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.count = 0
        self.name = ""  # the first signal's name
        self.event = threading.Event()
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # No printing here: a signal landing inside another print would make it a reentrant call.
        self.count += 1
        self.name = self.name or signal.Signals(signum).name
        self.event.set()

    @property
    def requested(self) -> bool:
        return self.count > 0

    def forced(self) -> bool:
        return self.count > 1

    def wait(self, timeout_s: float) -> bool:
        return self.event.wait(timeout_s)


# ----- readiness -------------------------------------------------------------------------------------
def _died_message(child: Child, when: str) -> str:
    return (
        f"{child.name} (pid {child.pid}) exited with code {child.proc.returncode} {when}; "
        f"last lines of {child.log_path}:\n{child.log_tail()}"
    )


def _health(base_url: str) -> tuple[bool, str]:
    """(/health is 200, its status and body, or why there was no answer)."""
    try:
        response = httpx.get(f"{base_url}/health", timeout=2.0)
    except httpx.HTTPError as exc:
        return False, f"no answer ({type(exc).__name__})"
    return response.status_code == 200, f"{response.status_code} {response.text[:200]}"


def wait_ready(stack: Stack, opts: UpOptions, base_url: str, redis_url: str, signals: StopSignals) -> bool:
    """True once /health is 200 and every cell's workers joined; False if a stop was asked first.
    Meanwhile the workers' phases are shown (cbserve/startup_progress.py)."""
    started_at = time.time() - 1.0  # a little slack for clock granularity
    deadline = time.monotonic() + opts.ready_timeout_s
    progress = StartupProgress.of([(c.name, c.log_path) for c in stack.services if "worker" in c.name])
    try:
        while not signals.requested:
            progress.poll()
            dead = stack.first_exited()
            if dead is not None:
                raise LaunchError(_died_message(dead, "before the stack was ready"))
            # /health is asked only once every worker has joined, when it answers 200: polling it while
            # the workers load their model would fill the gateway's log with 503 lines.
            joined = sum(
                min(n, joined_workers(redis_url, c, started_at)) for c, n in stack.num_workers.items()
            )
            expected = sum(stack.num_workers.values())
            healthy, health = _health(base_url) if joined >= expected else (False, "not asked yet")
            if healthy:
                return True
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"not ready after {opts.ready_timeout_s:g} s: /health {health}, "
                    f"{joined} of {expected} workers joined; logs in {stack.run_dir}"
                )
            signals.wait(0.2)
        return False
    finally:
        progress.done()


def served_model_name(base_url: str, fallback: str) -> str:
    """The first model /v1/models lists (the default one)."""
    try:
        data = httpx.get(f"{base_url}/v1/models", timeout=5.0).json()
        return str(data["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return fallback


def chat_command() -> str:
    """How to run `cbserve` from this shell: by name when on PATH, else by path (as after `make run`)."""
    script = Path(sys.executable).parent / "cbserve"
    on_path = shutil.which("cbserve")
    if on_path and Path(on_path).resolve() == script.resolve():
        return "cbserve"
    if script.is_file():
        with contextlib.suppress(ValueError):
            return str(script.relative_to(Path.cwd()))
        return str(script)
    return f"{sys.executable} -m cbserve"


def describe(plans: list[ModelPlan]) -> str:
    """ "2 workers", or "2 cells of 1 worker" with --cells; per model with several."""

    def size(plan: ModelPlan) -> str:
        workers = f"{plan.workers} worker{'s' if plan.workers != 1 else ''}"
        return workers if len(plan.cells) == 1 else f"{len(plan.cells)} cells of {workers}"

    if len(plans) == 1 and plans[0].config is None:
        return size(plans[0])
    return "; ".join(f"{p.name}: {size(p)}" for p in plans)


def shown_path(path: Path) -> str:
    """`path` relative to the working directory when it is below it (as `make run` prints it)."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def banner(
    base_url: str, env_file: Path, models: list[str], size: str, run_dir: Path, names: list[str]
) -> str:
    hello = [{"role": "user", "content": "Hello"}]
    model = models[0]
    body = json.dumps({"model": model, "messages": hello, "max_tokens": 32, "stream": True})
    served = f'model "{model}"' if len(models) == 1 else "models " + ", ".join(f'"{m}"' for m in models)
    return f"""
cbserve is ready: {base_url}  ({served}, {size})
logs:  {run_dir}/{{{",".join(names)}}}.log
stop:  Ctrl-C
the README's examples read CBSERVE_URL and REDIS_URL:  source {shown_path(env_file)}
  (the same in every run from this directory: Redis keeps its port and password)

Stream a chat completion with curl:
  curl -N {base_url}/v1/chat/completions -H 'content-type: application/json' -d '{body}'

Or with the OpenAI Python SDK (pip install openai):
  from openai import OpenAI
  client = OpenAI(base_url="{base_url}/v1", api_key="unused")
  stream = client.chat.completions.create(
      model={json.dumps(model)}, messages={json.dumps(hello)}, max_tokens=32, stream=True
  )
  for chunk in stream:
      if chunk.choices:
          print(chunk.choices[0].delta.content or "", end="", flush=True)
  print()

Or chat in this terminal:  {chat_command()} chat --base-url {base_url}
"""


def supervise(stack: Stack, signals: StopSignals, budget: RestartBudget) -> None:
    """Block until a stop is asked. A child that exits on its own is started again (restarts.py);
    one that died too often within the window is an error that stops everything."""
    while not signals.requested:
        dead = stack.first_exited()
        if dead is not None:
            restart(stack, dead, signals, budget)
        signals.wait(0.5)


def restart(stack: Stack, dead: Child, signals: StopSignals, budget: RestartBudget) -> None:
    now = time.monotonic()
    if not budget.allows(dead.name, now):
        raise LaunchError(
            _died_message(dead, "unexpectedly")
            + f"\n{dead.name} was restarted {budget.recent(dead.name, now)} times within "
            f"{budget.window_s:g} s (--max-restarts {budget.max_restarts}): stopping everything"
        )
    delay_s = budget.delay_s(dead.name, now)
    say(_died_message(dead, "unexpectedly") + f"\nrestarting {dead.name} in {delay_s:g} s")
    if signals.wait(delay_s):
        return  # a stop was asked meanwhile
    budget.record(dead.name, time.monotonic())
    child = stack.replace(dead, processes.respawn(dead))
    say(f"restarted {child.name} (pid {child.pid})")


def run_up(opts: UpOptions) -> int:
    """The whole `cbserve up`; returns the exit code (0 after Ctrl-C / SIGTERM)."""
    if opts.workers < 1 or opts.cells < 1 or opts.gateways < 1:
        print("cbserve: --workers, --cells and --gateways must be at least 1", file=sys.stderr)
        return 2
    try:
        plans = plan_models(
            opts.model, opts.models_config, opts.cells, opts.workers, os.environ, resolve_model
        )
        parse_lora_modules(opts.lora_modules or [])
        check_port_free(opts.host, opts.port)
        device, device_why = resolve_device(opts.device, os.environ)
        check_speculative_config(opts.speculative_config)
    except ValueError as exc:  # a models config, a CBSERVE_CELL or a LoRA module to change
        print(f"cbserve: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"cbserve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # during a hub download or the CUDA probe; nothing has been started yet
        return 0
    cell_models = {cell: plan.model_dir for plan in plans for cell in plan.cells}
    num_workers = {cell: plan.workers for plan in plans for cell in plan.cells}
    stack = Stack(run_dir=new_run_dir(opts.run_dir), cells=list(cell_models), num_workers=num_workers)
    base_url = connect_url(opts.host, opts.port)
    signals = StopSignals()
    signals.install()  # before any child exists, so no Ctrl-C can leave one behind
    try:
        for plan in plans:
            say(f"model {plan.model_dir}, {describe([plan])} on {device} ({device_why})")
        say(f"run directory (logs, Redis data): {stack.run_dir}")
        # What runs share (Redis' port and password, the env file): the checkout's, or the --run-dir's.
        state = RunState(opts.run_dir.resolve() if opts.run_dir else Path.cwd() / ".cbserve")
        redis_dir, redis_log = stack.run_dir / "redis", stack.run_dir / "redis.log"
        choice = resolve(opts.redis, redis_dir, redis_log, os.environ, state)
        stack.redis_server = choice.server
        say(f"Redis: {choice.kind} at {redact(choice.url)}")
        for reason in choice.reasons:
            say(f"  - {reason}")
        if signals.requested:
            return 0
        celery = opts.celery and celery_installed()
        if opts.celery and not celery:
            say(
                "no Celery worker: celery is not installed (pip install '.[celery]'), "
                "so Batch API batches stay in validating"
            )
        args = ServiceArgs(
            cell_models,
            device,
            choice.url,
            opts.host,
            opts.port,
            celery,
            opts.speculative_config,
            opts.gateways,
            write_models_file(plans, stack.run_dir),
            list(opts.lora_modules or []),
            opts.runner,
            opts.convert,
        )
        start_services(stack, args)
        pids = ", ".join(f"{c.name}={c.pid}" for c in stack.children())
        say(f"started {pids}; waiting for /health and {describe(plans)} to join")
        if not wait_ready(stack, opts, base_url, choice.url, signals):
            return 0
        model_names = [served_model_name(base_url, plans[0].name), *(p.name for p in plans[1:])]
        names = [c.name for c in stack.children()]
        # Redis' password goes in a file only the user reads, never on the screen.
        env_file = state.write_env(base_url, choice.url)
        print(banner(base_url, env_file, model_names, describe(plans), stack.run_dir, names))
        sys.stdout.flush()
        supervise(stack, signals, RestartBudget(opts.max_restarts, DEFAULT_RESTART_WINDOW_S))
        return 0
    except (LaunchError, RedisUnavailable) as exc:
        print(f"cbserve: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if signals.requested:
            say(f"{signals.name}: stopping (send it again to kill at once)")
        stack.stop(signals.forced)
        say(f"stopped everything; logs kept in {stack.run_dir}")
        signals.restore()
