"""One Redis Cluster master failover under load, shared by tests/cluster/test_cluster_failover.py and
scripts/measure_failover.py: greedy streams run in one cell, the master serving the cell's slot is
SIGKILLed mid-stream, its replica is promoted, and what happened is measured.

With `lose_writes`, the replica is paused (SIGSTOP) and its link closed by the master before the
kill, while every stream gets `lost_tokens` more tokens: the old master acknowledges them (the
clients receive them) but the replica never gets them, which is what asynchronous replication can
lose, made certain.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field

import redis

from common import streams
from harness.load import fault_clients as fault
from harness.processes.redis_cluster import RedisCluster
from harness.processes.services import Stack, wait_for

PROMOTION_TIMEOUT_S = 30.0  # cluster-node-timeout 2 s: FAIL after ~2-4 s, the election within ~1 s


def start_cell(stack: Stack, cell: str, num_workers: int = 1) -> None:
    """A batcher, `num_workers` workers and a gateway of one cell, all ready."""
    stack.start_batcher(CBSERVE_CELL=cell, **fault.FAST_TAKEOVER_ENV)
    for i in range(num_workers):
        stack.start_worker(f"worker{i}", CBSERVE_CELL=cell, **fault.WORKER_ENV)
    stack.start_gateway(CBSERVE_CELL=cell)
    stack.wait_ready(num_workers=0, timeout=240)
    wait_for(lambda: stack.num_workers_joined(cell) == num_workers, 240, f"cell {cell}'s workers to join")


def token_lengths(node: redis.Redis, cell: str) -> dict[str, int]:
    """Entries in each of `cell`'s token streams held by one node (its master holds them all)."""
    pattern = streams.token_stream(streams.placed_req_id(cell, "*"))
    keys = [k.decode() for k in node.scan_iter(match=pattern)]  # type: ignore[union-attr]
    return {k: int(node.xlen(k)) for k in keys}  # type: ignore[arg-type]


def repl_lag_bytes(master: redis.Redis, replica: redis.Redis) -> int:
    """Bytes of the replication stream the master has and the replica has not processed yet (read
    one after the other, master first: a slight underestimate under load)."""
    sent = int(master.info("replication")["master_repl_offset"])
    done = int(replica.info("replication")["slave_repl_offset"])
    return max(sent - done, 0)


@dataclass
class Failover:
    """What one failover did: times from the kill (monotonic seconds), lag, entries lost."""

    seen: list[fault.ClientStream]
    killed_at: float
    old_master: int
    new_master: int
    promoted_after_s: float = 0.0  # kill -> the replica is master and the cluster serves every slot
    writes_after_s: float = 0.0  # kill -> a write to the cell's slot through a cluster client succeeds
    resumed_after_s: float = 0.0  # kill -> every client has a token written after the failover
    longest_wait_s: float = 0.0  # the longest pause between two tokens of a client across it
    lag_samples: list[int] = field(default_factory=list)  # replication lag (bytes) under load
    lag_at_kill: int = 0
    events_at_kill: int = 0  # token events the old master held when it died
    events_kept: int = 0  # of them, what the promoted replica had

    @property
    def events_lost(self) -> int:
        return self.events_at_kill - self.events_kept

    def summary(self) -> str:
        lag = sorted(self.lag_samples) or [0]
        return (
            f"promoted after {self.promoted_after_s:.2f}s, writes after {self.writes_after_s:.2f}s, "
            f"streams resumed after {self.resumed_after_s:.2f}s (longest client wait "
            f"{self.longest_wait_s:.2f}s); replication lag under load "
            f"median {lag[len(lag) // 2]} B, max {lag[-1]} B, at the kill {self.lag_at_kill} B; "
            f"token events lost {self.events_lost} of {self.events_at_kill}; "
            f"client errors {sum(len(s.errors) for s in self.seen)}"
        )


def run_failover(
    stack: Stack,
    cluster: RedisCluster,
    cell: str,
    prompts: list[list[int]],
    max_tokens: int,
    lose_writes: bool = False,
    lost_tokens: int = 6,
) -> Failover:
    """Stream `prompts` in `cell`, kill its master once every stream has a few tokens, wait for the
    promotion and for every stream to finish."""
    cell_key = streams.cell_keys(cell).requests
    old = cluster.master_of(cell_key)
    new = cluster.replica_of(old)
    master, replica = redis.Redis(port=old), redis.Redis(port=new)
    client = stack.redis()
    run = Failover(seen=[], killed_at=0.0, old_master=old, new_master=new)

    last_ids: dict[str, bytes] = {}  # each token stream's last entry on the old master at the kill

    def kill() -> None:
        for _ in range(20):  # replication lag under load, sampled while the streams run
            run.lag_samples.append(repl_lag_bytes(master, replica))
        if lose_writes:
            # Paused, the replica still receives into its socket buffer; closing the link from the
            # master's side makes what follows reach the master alone.
            os.kill(cluster.proc(new).pid, signal.SIGSTOP)
            master.execute_command("CLIENT", "KILL", "TYPE", "replica")
            cut_at = int(master.info("replication")["master_repl_offset"])
            before = token_lengths(master, cell)
            more = lambda: all(n >= before[k] + lost_tokens for k, n in token_lengths(master, cell).items())  # noqa: E731
            wait_for(more, 30, "tokens the cut-off replica does not get")
            run.lag_at_kill = int(master.info("replication")["master_repl_offset"]) - cut_at
        else:
            run.lag_at_kill = repl_lag_bytes(master, replica)
        for key in token_lengths(master, cell):
            last_ids[key] = master.xrevrange(key, count=1)[0][0]  # type: ignore[index]
        run.events_at_kill = sum(len(master.xrange(key, "-", last_id)) for key, last_id in last_ids.items())  # type: ignore[arg-type]
        cluster.kill(old)
        run.killed_at = time.monotonic()
        if lose_writes:
            os.kill(cluster.proc(new).pid, signal.SIGCONT)

    def promoted() -> None:
        wait_for(lambda: cluster.is_master(new), PROMOTION_TIMEOUT_S, f"replica {new} to be promoted", 0.01)
        run.promoted_after_s = time.monotonic() - run.killed_at
        wait_for(lambda: _writes(client, cell_key), PROMOTION_TIMEOUT_S, "a write to the cell's slot", 0.01)
        run.writes_after_s = time.monotonic() - run.killed_at

    try:
        run.seen, _ = asyncio.run(
            fault.run_with_fault(
                stack.base_url, prompts, max_tokens, fault.TOKENS_BEFORE_FAULT, kill, promoted
            )
        )
    finally:
        proc = cluster.proc(new)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        client.close()
    # Entries a new attempt adds get later ids: what is at or before the old last id was kept.
    run.events_kept = sum(len(replica.xrange(key, "-", last_id)) for key, last_id in last_ids.items())  # type: ignore[arg-type]
    # Tokens sent before the kill may still be in flight to the clients; after writes work again
    # every token is a new one. The probe notices writes late when its client refreshes its slots
    # late: a stream that finished before then resumed no later than that.
    writes_at = run.killed_at + run.writes_after_s
    resumed = [next((t for t in s.arrivals if t > writes_at), writes_at) for s in run.seen]
    run.resumed_after_s = max(resumed) - run.killed_at
    run.longest_wait_s = fault.longest_wait(run.seen, run.killed_at)
    return run


def _writes(client: redis.Redis, key: str) -> bool:
    """A harmless write to `key`'s slot (a probe key in its slot, expiring) goes through."""
    try:
        client.set(key + ":failover-probe", "1", px=1000)
        return True
    except (redis.RedisError, redis.exceptions.RedisClusterException):
        return False
