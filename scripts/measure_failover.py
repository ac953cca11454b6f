"""Measure a Redis Cluster master failover under load: how long until the promoted replica takes
writes, until every client stream goes on, the replication lag, and what was lost or recomputed.

    python -m scripts.measure_failover                  # a plain SIGKILL of the cell's master
    python -m scripts.measure_failover --lose-writes    # the replica cut off first: writes lost

Starts a local 3-master, 3-replica cluster (harness/processes/redis_cluster.py, cluster-node-timeout 2 s) and
one cell on it (a batcher, a worker, a gateway: the processes the tests use) on the demo model,
streams greedy completions, SIGKILLs the master serving the cell's slot once every stream has a few
tokens (harness/load/cluster_failover.py), and prints per run: kill -> replica promoted, kill -> a write to
the slot succeeds, kill -> every client has a new token, the longest client wait, the replication
lag sampled under load, token events lost, requests the batcher rebuilt, and client streams that
differ from `generate` (must be 0). Run from the repository root.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness.load.cluster_failover import run_failover, start_cell
from harness.load.fault_clients import random_cases
from harness.processes.redis_cluster import redis_cluster
from harness.processes.services import cluster_stack
from harness.processes.stack_script import stack_script_parser

CELL = "a"


def measure_once(args: argparse.Namespace, prompts: list[list[int]], expected: list[list[int]]) -> str:
    with (
        tempfile.TemporaryDirectory() as tmp,
        redis_cluster(Path(tmp) / "cluster") as cluster,
        cluster_stack(cluster.url, args.model, Path(tmp)) as stack,
    ):
        start_cell(stack, CELL)
        run = run_failover(stack, cluster, CELL, prompts, args.max_tokens, args.lose_writes, args.lost_tokens)
        stack.check_alive()
        stats = stack.stats(CELL)
    wrong = sum(s.token_ids != e for s, e in zip(run.seen, expected, strict=True))
    return f"{run.summary()}; requests rebuilt {int(stats.get('num_recovered', 0))}; wrong streams {wrong}"


def main() -> None:
    parser = stack_script_parser(__doc__)
    parser.add_argument("--lose-writes", action="store_true", help="cut the replica off before the kill")
    parser.add_argument("--lost-tokens", type=int, default=6, help="tokens per stream the replica misses")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    prompts, expected = random_cases(args.model, 0, args.streams, args.max_tokens)
    print(f"lose_writes={args.lose_writes} streams={args.streams} max_tokens={args.max_tokens}", flush=True)
    for run in range(args.runs):
        print(f"run {run}: {measure_once(args, prompts, expected)}", flush=True)


if __name__ == "__main__":
    main()
