"""Speculative decoding through the whole pipeline (HTTP -> Redis -> batcher -> worker): greedy tokens
with n-gram or suffix drafts equal transformers' `generate`, streamed or not, with chunked prefill,
prefix hits and preemption, and drafts are accepted (the prompts repeat themselves)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.gpu.gpu_parity import reference_greedy
from harness.load.load_clients import completion_body
from harness.processes.services import Stack

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
SUFFIX = json.dumps({"method": "suffix", "num_speculative_tokens": 6})
# The served model drafting for itself (its directory is added per test): drafts from the worker.
DRAFT_MODEL = {"method": "draft_model", "num_speculative_tokens": 3}
PATTERN = [17, 301, 52, 99, 260, 8, 411, 96]
# Repeated text, a second turn of the first (a prefix hit once the first is cached), a long one that
# takes chunks, and one with nothing repeated.
FIRST = [
    (PATTERN * 5, 30),
    ([5, 6, 7, 8, 9, 10, 11, 12, 13], 20),
    ([*PATTERN[::-1], 77] * 9, 36),
]
LATER = [
    (PATTERN * 5 + [3, 4] + PATTERN * 2, 28),
    (PATTERN * 3, 25),
]


@pytest.fixture(scope="module")
def expected(tiny_model_dir: Path) -> list[list[int]]:
    cases = FIRST + LATER
    return reference_greedy(tiny_model_dir, [p for p, _ in cases], [m for _, m in cases])


async def complete(
    client: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int, stream: bool
) -> list[int]:
    body = {"model": model, **completion_body(prompt, max_tokens, stream=stream)}
    if not stream:
        resp = await client.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text
        return list(resp.json()["choices"][0]["token_ids"])
    token_ids: list[int] = []
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[len("data: ") :])["choices"]:
                    token_ids.extend(choice.get("token_ids") or [])
    return token_ids


async def run_wave(stack: Stack, cases: list[tuple[list[int], int]]) -> list[list[int]]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=httpx.Timeout(120.0)) as client:
        runs = [
            complete(client, stack.model_dir.name, prompt, max_tokens, stream=i % 2 == 0)
            for i, (prompt, max_tokens) in enumerate(cases)
        ]
        return await asyncio.wait_for(asyncio.gather(*runs), timeout=180)


CONFIGS: dict[str, dict[str, str]] = {
    # A 32-token budget chunks the long prompts; the second wave finds the first's blocks cached.
    "chunked": {"SPECULATIVE_CONFIG": NGRAM, "BATCHER_MAX_NUM_BATCHED_TOKENS": "32"},
    # 8 blocks of 16 tokens hold the longest request and little else: preemption is certain.
    "preempted": {
        "SPECULATIVE_CONFIG": NGRAM,
        "BATCHER_MAX_NUM_BATCHED_TOKENS": "32",
        "BATCHER_MAX_NUM_SEQS": "8",
    },
    # Suffix decoding: the second wave also finds the first wave's requests in the batcher's cache.
    "suffix": {"SPECULATIVE_CONFIG": SUFFIX, "BATCHER_MAX_NUM_BATCHED_TOKENS": "32"},
    # Two steps in flight: a drafting request waits for its step, the others pipeline.
    "async": {
        "SPECULATIVE_CONFIG": NGRAM,
        "BATCHER_MAX_NUM_BATCHED_TOKENS": "32",
        "BATCHER_ASYNC_SCHEDULING": "true",
    },
    "draft_model": {"BATCHER_MAX_NUM_BATCHED_TOKENS": "32"},
}
WORKER_ENV: dict[str, dict[str, str]] = {
    "chunked": {"WORKER_BLOCK_SIZE": "16"},
    "preempted": {"WORKER_NUM_BLOCKS": "8", "WORKER_BLOCK_SIZE": "16"},
    "suffix": {"WORKER_BLOCK_SIZE": "16"},
    "async": {"WORKER_BLOCK_SIZE": "16"},
    "draft_model": {"WORKER_BLOCK_SIZE": "16"},
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_with_drafts_matches_generate(
    config: str, make_stack: Callable[[], Stack], expected: list[list[int]]
) -> None:
    stack = make_stack()
    batcher_env, worker_env = CONFIGS[config], WORKER_ENV[config]
    if config == "draft_model":
        draft = json.dumps(DRAFT_MODEL | {"model": str(stack.model_dir)})
        batcher_env, worker_env = (env | {"SPECULATIVE_CONFIG": draft} for env in (batcher_env, worker_env))
    stack.start_all(1, batcher_env=batcher_env, worker_env=worker_env)
    got = asyncio.run(run_wave(stack, FIRST)) + asyncio.run(run_wave(stack, LATER))
    mismatched = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    assert not mismatched, (
        f"requests {mismatched} differ from generate: {[(got[i], expected[i]) for i in mismatched]}"
    )
    stats = stack.stats_after(len(expected))
    assert stats["spec_decode_num_accepted_tokens"] > 0
    assert stats["num_partial_prefills"] > 0
    if config == "preempted":
        assert stats["num_preemptions"] > 0
    elif config == "chunked":
        assert stats["prefix_cache_hits"] > 0
        assert_spec_metrics(stack, stats)


def assert_spec_metrics(stack: Stack, stats: dict[str, float]) -> None:
    """/metrics shows the batcher's counters under vLLM's names, acceptance per position adding up."""
    text = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    values = {s.name: s.value for s in samples if not s.labels}
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert values[f"cbserve:spec_decode_{name}_total"] == stats[f"spec_decode_{name}"]
    per_pos = {
        int(s.labels["position"]): s.value
        for s in samples
        if s.name == "cbserve:spec_decode_num_accepted_tokens_per_pos_total"
    }
    assert per_pos[0] > 0 and sum(per_pos.values()) == stats["spec_decode_num_accepted_tokens"]
    assert all(per_pos[i] >= per_pos[i + 1] for i in range(len(per_pos) - 1))  # a run is a prefix
