"""A Redis Cluster master dies (SIGKILL) mid-stream and its replica takes over: nothing is wrong.

One cell (a batcher, a worker, a gateway) serves six greedy streams on a real 3-master, 3-replica
cluster. Once every stream has a few tokens the master that serves the cell's slot is SIGKILLed; its
replica is promoted (cluster-node-timeout 2 s). Replication is asynchronous, so what the old master
acknowledged but had not yet sent is lost with it:
- `replicated`: a plain kill; whatever the lag was at that instant is lost (usually nothing);
- `lost-writes`: the replica is paused and cut off while every stream gets 6 more tokens (which the
  clients receive), then the master is killed and the replica resumed: those writes are lost.

Every service sees its cluster client's calls fail, then find the new master (redis-py refreshes
the slot map); the batcher rebuilds from what the promoted replica holds, as after a Redis restart.
Every client gets exactly `generate`'s tokens on its first connection, each index is written with
one token, nothing stays pending, and new requests succeed after the failover.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from common import streams
from harness.load import fault_clients as fault
from harness.load.cluster_failover import Failover, run_failover, start_cell
from harness.processes.redis_cluster import RedisCluster, assert_no_crossslot, redis_cluster
from harness.processes.services import Stack, cluster_stack

CELL = "a"
NUM_STREAMS = 6
MAX_TOKENS = 96
NUM_AFTER = 10  # new requests sent once the streams finished


cases = fault.cases_fixture(17, NUM_STREAMS, MAX_TOKENS)


@pytest.fixture()
def own_cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    """A cluster of this test's own: the test kills one of its masters."""
    with redis_cluster(tmp_path / "cluster") as cluster:
        yield cluster


@pytest.fixture()
def stack(own_cluster: RedisCluster, tiny_model_dir: Path, tmp_path: Path) -> Iterator[Stack]:
    with cluster_stack(own_cluster.url, tiny_model_dir, tmp_path) as stack:
        start_cell(stack, CELL)
        yield stack


def _check(stack: Stack, run: Failover, expected: list[list[int]]) -> None:
    stack.check_alive()  # no service exited on the failover
    fault.check_clients(run.seen, expected)
    for i, s in enumerate(run.seen):
        ids = [tuple(int(p) for p in e.split("-")) for e in s.entry_ids]
        assert ids == sorted(set(ids)), f"stream {i}: SSE ids repeat or go back: {s.entry_ids}"
    new_master = redis.Redis(port=run.new_master)
    token_streams = fault.raw_token_events(new_master, cell=CELL)
    assert len(token_streams) == NUM_STREAMS
    for events in token_streams:
        fault.check_one_token_per_index(events, MAX_TOKENS)
    keys = streams.cell_keys(CELL)
    assert new_master.xpending(keys.requests, streams.BATCHER_GROUP)["pending"] == 0
    stats = stack.stats(CELL)
    assert stats["num_recovered"] == NUM_STREAMS and stats["num_failed"] == 0, stats
    # It waited for the cell's own slot to answer, not any node: one rebuild or two, not one each
    # time a node of another slot answered a PING while the slot had no master. A rebuild is a new
    # term: after "redis unreachable", or after its lease expired during a slow promotion (the
    # cluster client retries into the new master, which holds the lease no more).
    terms = (stack.log_dir / "batcher.log").read_text().count("took the leadership")
    assert 1 <= terms - 1 <= 3, terms


async def _new_requests(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        body = {"prompt": [5, 6, 7], "max_tokens": 2}
        replies = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(NUM_AFTER)))
    failed = [r.text for r in replies if r.status_code != 200]
    assert not failed, f"{len(failed)} of {NUM_AFTER} new requests failed after the failover: {failed[:3]}"


@pytest.mark.parametrize("lose_writes", [False, True], ids=["replicated", "lost-writes"])
def test_a_killed_master_fails_over_and_every_stream_completes(
    lose_writes: bool, stack: Stack, own_cluster: RedisCluster, cases: fault.FaultCases
) -> None:
    prompts, expected = cases
    run = run_failover(stack, own_cluster, CELL, prompts, MAX_TOKENS, lose_writes=lose_writes)
    print(f"\nmaster failover ({'lost-writes' if lose_writes else 'replicated'}): {run.summary()}")
    assert own_cluster.master_of(streams.cell_keys(CELL).requests) == run.new_master
    _check(stack, run, expected)
    if lose_writes:  # the case is real: the clients had tokens the promoted replica never got
        assert run.events_lost >= NUM_STREAMS, run.summary()
    assert run.resumed_after_s < 20, run.summary()
    asyncio.run(_new_requests(stack.base_url))
    assert_no_crossslot(own_cluster)
