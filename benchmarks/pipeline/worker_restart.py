"""How soon a killed worker's replacement serves: SIGKILL the only worker mid-stream, start a new one
at once (as a supervisor would), and time the replacement's start and the stream's next token.

    python -m benchmarks.pipeline.worker_restart                          # demo model, 3 runs
    python -m benchmarks.pipeline.worker_restart --heartbeat-timeout 5    # the batcher's default detection

Starts a private redis-server, the batcher, one worker (WORKER_COMPILE=true on the user's compile
cache, or --cache-dir) and the gateway, and streams a greedy completion. Each run kills the worker
once the stream has a few tokens, starts the replacement, and prints:
- start -> registered: the replacement's process start to its hello in Redis (all of its start-up),
  and the CPU time it had used by then (its children's included): about what the start takes on an
  idle machine, whatever else this one runs;
- start -> first token: to the stream's next token, which only the replacement can produce;
- kill -> first token: what the client waited (at least the batcher's BATCHER_HEARTBEAT_TIMEOUT_S);
- the replacement's phases from its log, in seconds after its start.
Run from the repository root; the first worker compiles the forward if the cache has none.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx

from benchmarks.load.sse import SSEParser
from common import streams
from harness.processes.redis_server import redis_server
from harness.processes.services import Stack, wait_for
from harness.processes.stack_script import stack_script_parser

# The worker's log lines that mark its start-up (gpu_worker/runner/: load_model.py, forward/,
# profile.py; gpu_worker/service/worker.py): the weights' start, the compiled forward ready (or its
# compile's start), profiling's start, registered.
PHASES = {
    "weights": "loading the weights of",
    "forward": "compiled forward from cache|compiling the forward|compiled the forward in",
    "profiling": "profiling memory",
    "serving": r"worker \S+ serving",
}


class Stream:
    """A streamed greedy completion on a thread of its own, recording when each token chunk arrives."""

    def __init__(self, base_url: str, model: str, prompt: list[int], max_tokens: int) -> None:
        self.arrivals: list[float] = []
        self.error = ""
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        self._thread = threading.Thread(target=self._read, args=(base_url, {**body, "stream": True}))
        self._thread.start()

    def _read(self, base_url: str, body: dict[str, object]) -> None:
        parser = SSEParser()
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=300) as response:
            if response.status_code != 200:
                self.error = f"{response.status_code} {response.read()[:300]!r}"
                return
            for chunk in response.iter_bytes():
                for data in parser.feed(chunk):
                    if data != "[DONE]" and '"text"' in data:
                        self.arrivals.append(time.monotonic())

    def tokens(self, at_least: int) -> bool:
        if self.error:
            raise RuntimeError(f"the stream failed: {self.error}")
        return len(self.arrivals) >= at_least

    def first_after(self, moment: float) -> float | None:
        return next((t for t in self.arrivals if t > moment), None)

    def join(self) -> None:
        self._thread.join(timeout=300)


def _worker_ids(stack: Stack) -> set[str]:
    with stack.redis() as client:
        return {k.decode() for k in client.hkeys(streams.cell_keys(streams.DEFAULT_CELL).workers)}


def cpu_seconds(pid: int) -> float:
    """User and system time of process `pid` and of its children it has waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def phases(log: str, started_wall: float) -> str:
    """Seconds after `started_wall` at which each phase's first log line was written."""
    found = []
    for name, pattern in PHASES.items():
        match = re.search(rf"^(\S+ \S+) .*(?:{pattern})", log, re.MULTILINE)
        if match:
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append(f"{name} {at - started_wall:.1f}")
    return ", ".join(found)


def restart_once(stack: Stack, run: int, args: argparse.Namespace, worker_env: dict[str, str]) -> str:
    victim_name = f"worker{run}"
    prompt = list(range(3, 3 + args.prompt_len))
    stream = Stream(stack.base_url, args.model.name, prompt, args.max_tokens)
    wait_for(lambda: stream.tokens(4), 120, "the stream's first tokens")
    before = _worker_ids(stack)
    killed_at = time.monotonic()
    stack.procs.pop(victim_name).send_signal(signal.SIGKILL)
    started_at, started_wall = time.monotonic(), time.time()
    name = f"worker{run + 1}"
    replacement = stack.start_worker(name, **worker_env)
    wait_for(lambda: bool(_worker_ids(stack) - before), 300, "the replacement to register", 0.005)
    registered_at = time.monotonic()
    cpu = cpu_seconds(replacement.pid)
    wait_for(lambda: stream.first_after(registered_at - 0.005) is not None, 120, "the replacement's token")
    first = stream.first_after(registered_at - 0.005)
    assert first is not None
    stream.join()
    return (
        f"start -> registered {registered_at - started_at:.2f} s (cpu {cpu:.2f} s), start -> first token "
        f"{first - started_at:.2f} s, kill -> first token {first - killed_at:.2f} s; "
        f"phases: {phases(stack.log(name), started_wall)}"
    )


def main() -> None:
    parser = stack_script_parser(__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--heartbeat-timeout", type=float, default=1.0, help="BATCHER_HEARTBEAT_TIMEOUT_S")
    parser.add_argument("--cache-dir", help="WORKER_COMPILE_CACHE_DIR (default: the worker's own default)")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    batcher_env = {
        "BATCHER_HEARTBEAT_TIMEOUT_S": str(args.heartbeat_timeout),
        "BATCHER_WORKER_CHECK_INTERVAL_S": "0.1",
    }
    worker_env = {
        "WORKER_COMPILE": "true",
        **({"WORKER_COMPILE_CACHE_DIR": args.cache_dir} if args.cache_dir else {}),
    }
    print(
        f"model {args.model}, heartbeat timeout {args.heartbeat_timeout} s, load {os.getloadavg()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as url:
        stack = Stack(redis_url=url, model_dir=args.model, log_dir=Path(tmp))
        try:
            stack.start_batcher(**batcher_env)
            stack.start_worker("worker0", **worker_env)
            stack.start_gateway()
            stack.wait_ready(num_workers=1, timeout=600)
            for run in range(args.runs):
                print(f"run {run}: {restart_once(stack, run, args, worker_env)}", flush=True)
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
