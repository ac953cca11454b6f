"""Prefix caching end to end: greedy tokens through the whole pipeline equal `generate`'s when
prompts share prefixes (whole blocks and partial ones), repeat exactly, resend a conversation's
history, ask for `n` choices, or run in a pool small enough to evict and preempt; and when the worker
holding the cached prefix is killed mid-stream."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from benchmarks.gpu.gpu_parity import reference_greedy as greedy_generate
from harness.load.fault_clients import run_with_fault
from harness.processes.services import Stack, wait_for
from tests.stack.e2e.test_e2e_correctness import Reference, assert_matches_generate

BLOCK_SIZE = 16


def make_cases(vocab_size: int) -> tuple[list[tuple[list[int], int]], list[int]]:
    """Prompts over three shared prefixes (2 blocks + 8 tokens, 4 blocks, 1 block + 3 tokens), one
    repeated exactly, and one the conversation continuing another (filled in after the reference)."""
    rng = random.Random(99)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, vocab_size) for _ in range(n)]

    prefixes = [tokens(2 * BLOCK_SIZE + 8), tokens(4 * BLOCK_SIZE), tokens(BLOCK_SIZE + 3)]
    cases = [(prefixes[i % 3] + tokens(rng.randrange(1, 20)), rng.randrange(8, 30)) for i in range(14)]
    cases.append(cases[1])  # the same prompt again: all but its last block comes from the cache
    return cases, [len(p) for p in prefixes]


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Reference:
    from transformers import AutoConfig

    cases, _ = make_cases(AutoConfig.from_pretrained(tiny_model_dir).vocab_size)
    first = greedy_generate(tiny_model_dir, [p for p, _ in cases], [m for _, m in cases])
    # A second turn resends the first conversation's prompt and answer, and adds to it.
    turn2 = (cases[0][0] + first[0] + cases[2][0][-5:], 12)
    [answer] = greedy_generate(tiny_model_dir, [turn2[0]], [turn2[1]])
    return [*cases, turn2], [*first, answer]


WORKER_ENV = {"WORKER_BLOCK_SIZE": str(BLOCK_SIZE)}
# name -> (workers, batcher settings, extra worker settings)
CONFIGS: dict[str, tuple[int, dict[str, str], dict[str, str]]] = {
    "one_worker": (1, {}, {}),
    # Cache hits first (SGLang's longest-prefix-match): only the order of admission changes.
    "lpm": (1, {"BATCHER_WAITING_ORDER": "lpm"}, {}),
    # 12 blocks: cached prefixes are evicted and requests preempted; chunks of 32 tokens.
    "evict_and_preempt": (
        1,
        {
            "BATCHER_MAX_NUM_BATCHED_TOKENS": "32",
            "BATCHER_MAX_NUM_SEQS": "8",
            "BATCHER_ASYNC_SCHEDULING": "true",
        },
        {"WORKER_NUM_BLOCKS": "12"},
    ),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_with_prefix_hits_matches_generate(
    config: str, make_stack: Callable[[], Stack], reference: Reference
) -> None:
    num_workers, batcher_env, worker_env = CONFIGS[config]
    stack = make_stack().start_all(num_workers, batcher_env, {**WORKER_ENV, **worker_env})
    stats = assert_matches_generate(stack, reference, num_later=1)  # the second turn after the first
    assert stats["prefix_cache_hits"] > 0, stats
    if config == "evict_and_preempt":
        assert stats["num_preemptions"] > 0


def test_n_choices_share_the_prompt_and_each_reports_cached_tokens(
    make_stack: Callable[[], Stack], tiny_model_dir: Path
) -> None:
    stack = make_stack().start_all(1, worker_env=WORKER_ENV)
    # 9 full blocks: the choices' decodes read them once, together (cascade attention's shared head).
    full_blocks = 9
    prompt = [5 + i % 400 for i in range(full_blocks * BLOCK_SIZE + 2)]
    [expected] = greedy_generate(tiny_model_dir, [prompt], [10])
    body = {"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "n": 3}
    body["return_token_ids"] = True
    resp = httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert [c["token_ids"] for c in data["choices"]] == [expected] * 3
    # The prompt was computed once: the other two choices found its full blocks cached.
    stats = stack.stats()
    assert stats["prefix_cache_hits"] == 2 * full_blocks * BLOCK_SIZE, stats
    # The prompt is billed once, as first computed: nothing of it was cached then.
    assert data["usage"]["prompt_tokens"] == len(prompt)
    assert data["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    again = httpx.post(f"{stack.base_url}/v1/completions", json={**body, "n": 1}, timeout=120).json()
    assert again["choices"][0]["token_ids"] == expected
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == full_blocks * BLOCK_SIZE


def test_killing_the_worker_that_holds_the_prefix_keeps_every_stream_exact(
    make_stack: Callable[[], Stack], tiny_model_dir: Path
) -> None:
    rng = random.Random(5)
    prefix = [rng.randrange(3, 500) for _ in range(3 * BLOCK_SIZE)]
    prompts = [prefix + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 9))] for _ in range(6)]
    expected = greedy_generate(tiny_model_dir, prompts, 64)
    stack = make_stack().start_all(
        2,
        {"BATCHER_HEARTBEAT_TIMEOUT_S": "1.5", "BATCHER_WORKER_CHECK_INTERVAL_S": "0.1"},
        {**WORKER_ENV, "WORKER_HEARTBEAT_INTERVAL_S": "0.2"},
    )
    victim: list[str] = []

    def kill_the_busiest() -> None:
        steps = {k.split(":", 1)[1]: v for k, v in stack.stats().items() if k.startswith("num_steps:")}
        busiest = max(steps, key=lambda wid: steps[wid])
        [name] = [n for n, p in stack.procs.items() if n.startswith("worker") and f"-{p.pid}-" in busiest]
        victim.append(name)
        os.kill(stack.procs[name].pid, signal.SIGKILL)

    def declared_dead() -> None:
        wait_for(lambda: stack.stats().get("num_workers_lost", 0) >= 1, 30, "the batcher to notice the kill")

    seen, _ = asyncio.run(run_with_fault(stack.base_url, prompts, 64, 4, kill_the_busiest, declared_dead))
    stack.procs.pop(victim[0]).wait(timeout=10)
    for i, s in enumerate(seen):
        assert not s.errors and s.token_ids == expected[i], f"stream {i} differs from generate"
    stats = stack.stats()
    assert stats["num_failovers"] >= 1 and stats["prefix_cache_hits"] > 0, stats


def test_concurrent_requests_sharing_a_prefix_compute_it_once(
    make_stack: Callable[[], Stack], tiny_model_dir: Path
) -> None:
    # Three prefixes of 4 blocks, three requests each, all sent at once to a worker computing
    # 32-token chunks with async scheduling: each prefix is computed by the first of its requests
    # only (a prefix's blocks are findable once the chunk computing them is sent, and one worker
    # admits a request only once the running prompts' chunks are; across workers prefix_wait.py
    # holds it back instead: tests/unit/batcher/test_prefix_wait.py).
    rng = random.Random(7)
    prefixes = [[rng.randrange(3, 500) for _ in range(4 * BLOCK_SIZE)] for _ in range(3)]
    prompts = [prefixes[i % 3] + [rng.randrange(3, 500) for _ in range(5 + i)] for i in range(9)]
    expected = greedy_generate(tiny_model_dir, prompts, 12)
    batcher_env = {"BATCHER_MAX_NUM_BATCHED_TOKENS": "32", "BATCHER_ASYNC_SCHEDULING": "true"}
    stack = make_stack().start_all(1, batcher_env, WORKER_ENV)

    async def one(client: httpx.AsyncClient, prompt: list[int]) -> dict:
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        resp = await client.post("/v1/completions", json={**body, "return_token_ids": True})
        assert resp.status_code == 200, resp.text
        return resp.json()

    async def all_at_once() -> list[dict]:
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=120) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    answers = asyncio.run(all_at_once())
    assert [a["choices"][0]["token_ids"] for a in answers] == expected
    cached = [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    for group in range(3):
        assert sorted(cached[group::3]) == [0, 4 * BLOCK_SIZE, 4 * BLOCK_SIZE], cached
    assert stack.stats()["prefix_cache_hits"] == 6 * 4 * BLOCK_SIZE
