"""Two cells on one Redis Cluster behind one gateway: requests spread over both, each cell's batcher
and workers serve only its own, greedy output equals `generate`, and a worker or a batcher killed in
a cell loses nothing (its requests resume on the cell's other worker; a new batcher of the cell
rebuilds them while the other cell's batcher goes on). No command spans slots.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.load import fault_clients as fault
from harness.processes.redis_cluster import RedisCluster, assert_no_crossslot
from harness.processes.services import Stack, cluster_stack, wait_for

CELLS = ("a", "b")
BATCHER_ENV = fault.FAST_HEARTBEAT_ENV


@pytest.fixture(scope="module")
def stack(
    cluster: RedisCluster, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Cell a: a batcher and two workers; cell b: a batcher and one worker; a gateway placing in both."""
    with cluster_stack(cluster.url, tiny_model_dir, tmp_path_factory.mktemp("cells-stack")) as stack:
        for cell in CELLS:
            stack.start_batcher(f"batcher-{cell}", CBSERVE_CELL=cell, **BATCHER_ENV)
        stack.start_worker("worker-a0", CBSERVE_CELL="a", **fault.WORKER_ENV)
        stack.start_worker("worker-a1", CBSERVE_CELL="a", **fault.WORKER_ENV)
        stack.start_worker("worker-b0", CBSERVE_CELL="b", **fault.WORKER_ENV)
        stack.start_gateway(GATEWAY_CELLS="a,b", CBSERVE_CELL="a")
        stack.wait_ready(num_workers=0, timeout=240)  # /health: a worker of some cell is alive
        for cell, num_workers in (("a", 2), ("b", 1)):
            joined = lambda c=cell, n=num_workers: stack.num_workers_joined(c) == n  # noqa: E731
            wait_for(joined, 240, f"cell {cell}'s workers to join")
        yield stack


cases = fault.cases_fixture(11)


def test_two_cells_share_the_requests_and_a_worker_kill_loses_nothing(
    stack: Stack, cluster: RedisCluster, cases: fault.FaultCases
) -> None:
    prompts, expected = cases
    victim = stack.procs["worker-a1"]

    def kill() -> None:
        victim.send_signal(signal.SIGKILL)

    def declared_dead() -> None:
        lost = lambda: stack.stats("a").get("num_workers_lost", 0) >= 1  # noqa: E731
        wait_for(lost, 30, "cell a's batcher to notice the kill")

    seen, _ = asyncio.run(
        fault.run_with_fault(
            stack.base_url, prompts, fault.MAX_TOKENS, fault.TOKENS_BEFORE_FAULT, kill, declared_dead
        )
    )
    victim.wait(timeout=10)
    del stack.procs["worker-a1"]  # expected dead
    fault.check_clients(seen, expected)

    # A client can see its last token before its batcher has counted the request (Stack.stats_after).
    def finished_by_cell() -> dict[str, float]:
        return {cell: stack.stats(cell).get("num_finished", 0) for cell in CELLS}

    wait_for(lambda: sum(finished_by_cell().values()) >= len(prompts), 30, "both batchers to count the load")
    finished = finished_by_cell()
    assert all(finished.values()) and sum(finished.values()) == len(prompts), finished  # both cells served
    assert stack.stats("b").get("num_workers_lost", 0) == 0  # the other cell saw nothing

    # /metrics reads both cells (a pipeline per cell, each in its slot): their vllm:* load gauges.
    def cell_gauges() -> dict[tuple[str, str], float]:
        text = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
        return {
            (s.name, s.labels["cell"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("vllm:")
        }

    names = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
    idle = {(name, cell): 0.0 for name in names for cell in CELLS}
    wait_for(lambda: cell_gauges() == idle, 15, "both cells' load gauges to show them idle")
    assert_no_crossslot(cluster)


def test_a_batcher_kill_in_a_cell_loses_nothing(
    stack: Stack, cluster: RedisCluster, cases: fault.FaultCases
) -> None:
    """Cell b's batcher is SIGKILLed mid-stream and a new one started: it takes the cell's lease (a
    new epoch of that cell alone) and rebuilds the cell from Redis; cell a's batcher goes on."""
    prompts, expected = cases
    victim = stack.procs["batcher-b"]
    epochs = {cell: stack.stats(cell)["epoch"] for cell in CELLS}

    def kill_and_restart() -> None:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        del stack.procs["batcher-b"]  # expected dead
        stack.start_batcher("batcher-b2", CBSERVE_CELL="b", **BATCHER_ENV)

    def took_over() -> None:
        new_epoch = lambda: stack.stats("b").get("epoch", 0) == epochs["b"] + 1  # noqa: E731
        wait_for(new_epoch, 60, "cell b's new batcher to take its lease")

    seen, _ = asyncio.run(
        fault.run_with_fault(
            stack.base_url, prompts, fault.MAX_TOKENS, fault.TOKENS_BEFORE_FAULT, kill_and_restart, took_over
        )
    )
    fault.check_clients(seen, expected)
    stats = {cell: stack.stats(cell) for cell in CELLS}
    assert stats["a"]["epoch"] == epochs["a"], stats  # the other cell's batcher never stopped
    assert stats["b"]["num_recovered"] >= 1, stats  # it held requests when killed
    assert stats["b"]["num_failed"] == 0, stats
    assert_no_crossslot(cluster)
