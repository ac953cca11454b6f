"""Measure how long clients wait when a worker (or the batcher) dies mid-generation.

    python -m scripts.measure_recovery                      # defaults: 5 s heartbeat timeout
    python -m scripts.measure_recovery --heartbeat-timeout 1.5 --heartbeat-interval 0.2 --check-interval 0.1
    python -m scripts.measure_recovery --target batcher     # active + standby batcher, 5 s lease

Starts a private redis-server, the batcher, two workers and the gateway (the processes the tests use)
on the demo model, streams greedy completions, SIGKILLs (or SIGSTOPs) one worker once every stream
has a few tokens, and prints: when the batcher declared it dead, and the longest any client waited
for its next token. With `--target batcher` a standby batcher runs too and the active one is the
victim; "declared dead" is then when the standby took the lease. Run from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import tempfile
import time
from pathlib import Path

from harness.load.fault_clients import longest_wait, run_with_fault
from harness.processes.redis_server import redis_server
from harness.processes.services import Stack, wait_for
from harness.processes.stack_script import stack_script_parser


def measure_once(args: argparse.Namespace, prompts: list[list[int]]) -> str:
    batcher_env = {
        "BATCHER_HEARTBEAT_TIMEOUT_S": str(args.heartbeat_timeout),
        "BATCHER_WORKER_CHECK_INTERVAL_S": str(args.check_interval),
        "BATCHER_LEASE_TTL_S": str(args.lease_ttl),
        "BATCHER_STANDBY_POLL_S": str(args.standby_poll),
    }
    worker_env = {"WORKER_HEARTBEAT_INTERVAL_S": str(args.heartbeat_interval)}
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as url:
        stack = Stack(redis_url=url, model_dir=args.model, log_dir=Path(tmp))
        victim = None
        try:
            victim = stack.start_batcher("batcher", BATCHER_BATCHER_ID="a", **batcher_env)
            if args.target == "batcher":
                wait_for(lambda: stack.stats().get("epoch", 0) == 1, 60, "the first batcher to lead")
                stack.start_batcher("standby", BATCHER_BATCHER_ID="b", **batcher_env)
            stack.start_worker("worker0", **worker_env)
            worker1 = stack.start_worker("worker1", **worker_env)
            victim = worker1 if args.target == "worker" else victim
            stack.start_gateway()
            stack.wait_ready(num_workers=2)
            times: dict[str, float] = {}

            def fault() -> None:
                times["fired"] = time.monotonic()
                assert victim is not None
                os.kill(victim.pid, signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)

            def detected() -> None:
                key, value = ("num_workers_lost", 1) if args.target == "worker" else ("epoch", 2)
                wait_for(lambda: stack.stats().get(key, 0) >= value, 60, "detection", 0.01)
                times["declared"] = time.monotonic()

            seen, fault_at = asyncio.run(
                run_with_fault(stack.base_url, prompts, args.max_tokens, 4, fault, detected)
            )
            errors = sum(len(s.errors) for s in seen)
            return (
                f"declared dead after {times['declared'] - times['fired']:.2f}s, "
                f"longest client wait {longest_wait(seen, fault_at):.2f}s, client errors {errors}"
            )
        finally:
            if args.fault == "stop" and victim is not None and victim.poll() is None:
                os.kill(victim.pid, signal.SIGCONT)
            stack.stop()


def main() -> None:
    parser = stack_script_parser(__doc__)
    parser.add_argument("--heartbeat-timeout", type=float, default=5.0, help="BATCHER_HEARTBEAT_TIMEOUT_S")
    parser.add_argument("--heartbeat-interval", type=float, default=1.0, help="WORKER_HEARTBEAT_INTERVAL_S")
    parser.add_argument("--check-interval", type=float, default=0.5, help="BATCHER_WORKER_CHECK_INTERVAL_S")
    parser.add_argument("--fault", choices=["kill", "stop"], default="kill")
    parser.add_argument("--target", choices=["worker", "batcher"], default="worker")
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="BATCHER_LEASE_TTL_S")
    parser.add_argument("--standby-poll", type=float, default=0.5, help="BATCHER_STANDBY_POLL_S")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 200) for _ in range(rng.randrange(3, 30))] for _ in range(args.streams)]
    print(
        f"target={args.target} fault={args.fault} timeout={args.heartbeat_timeout}s "
        f"interval={args.heartbeat_interval}s lease={args.lease_ttl}s"
    )
    for run in range(args.runs):
        print(f"run {run}: {measure_once(args, prompts)}", flush=True)


if __name__ == "__main__":
    main()
