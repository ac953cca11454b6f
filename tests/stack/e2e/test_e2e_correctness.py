"""The heart of the pipeline: greedy tokens through HTTP -> Redis -> batcher -> worker equal `generate`.

Sixteen requests with different prompt lengths and max_tokens arrive in waves: each wave starts only
once every streaming request of the previous wave has its first token, so new prefills always join a
batch that is mid-decode. The same requests run with one worker, with two, and with a KV pool small
enough (and a token budget low enough) to force preemption and chunked prefill, and with the
TGI-style admission policy, and with async scheduling; all must match.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from benchmarks.gpu.gpu_parity import reference_greedy
from harness.load.load_clients import completion_body
from harness.processes.services import Stack

WAVE = 4
PROMPT_LENS = [3, 90, 8, 13, 21, 34, 55, 5, 7, 17, 30, 44, 60, 70, 2, 120]
MAX_TOKENS = [4, 33, 12, 40, 7, 25, 16, 30, 9, 38, 21, 5, 28, 14, 36, 19]
# (prompt, max_tokens) of each request, and generate's greedy tokens for each
Reference = tuple[list[tuple[list[int], int]], list[list[int]]]


def make_cases(vocab_size: int) -> list[tuple[list[int], int]]:
    rng = random.Random(1234)
    # Ids 0-2 are the special tokens; ordinary ids make ordinary prompts.
    return [
        ([rng.randrange(3, vocab_size) for _ in range(n)], m)
        for n, m in zip(PROMPT_LENS, MAX_TOKENS, strict=True)
    ]


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Reference:
    """Each request alone through transformers' own generate (greedy, EOS ignored)."""
    from transformers import AutoConfig

    cases = make_cases(AutoConfig.from_pretrained(tiny_model_dir).vocab_size)
    outputs = reference_greedy(tiny_model_dir, [p for p, _ in cases], [m for _, m in cases])
    return cases, outputs


async def _stream(client: httpx.AsyncClient, body: dict[str, object], first: asyncio.Event) -> list[int]:
    token_ids: list[int] = []
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            for choice in chunk["choices"]:
                token_ids.extend(choice.get("token_ids") or [])
            if token_ids:
                first.set()
    return token_ids


async def _complete(client: httpx.AsyncClient, body: dict[str, object], first: asyncio.Event) -> list[int]:
    first.set()  # nothing to wait for: it is queued with the wave
    resp = await client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    return list(choice["token_ids"])


async def run_cases(base_url: str, cases: list[tuple[list[int], int]], model: str) -> list[list[int]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(300.0)) as client:
        tasks: list[asyncio.Task[list[int]]] = []
        for start in range(0, len(cases), WAVE):
            firsts = []
            for i in range(start, min(start + WAVE, len(cases))):
                prompt, max_tokens = cases[i]
                body = {"model": model, **completion_body(prompt, max_tokens, stream=i % WAVE != 3)}
                first = asyncio.Event()
                run = _stream if body["stream"] else _complete
                tasks.append(asyncio.create_task(run(client, body, first)))
                firsts.append(first)
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), timeout=120)
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)


def assert_matches_generate(stack: Stack, reference: Reference, num_later: int = 0) -> dict[str, float]:
    """Runs the reference's requests through `stack` (the last `num_later` only once the others have
    finished), asserts each one's greedy tokens equal generate's, and returns the batcher's stats."""
    cases, expected = reference
    split = len(cases) - num_later
    got = asyncio.run(run_cases(stack.base_url, cases[:split], stack.model_dir.name))
    if num_later:
        got += asyncio.run(run_cases(stack.base_url, cases[split:], stack.model_dir.name))
    mismatched = [i for i in range(len(cases)) if got[i] != expected[i]]
    assert not mismatched, (
        f"requests {mismatched} differ from generate: {[(got[i], expected[i]) for i in mismatched]}"
    )
    stats = stack.stats_after(len(cases))
    assert stats["num_finished"] == len(cases)
    return stats


CONFIGS: dict[str, dict[str, object]] = {
    "one_worker": {"workers": 1, "worker_env": {}, "batcher_env": {}},
    "two_workers": {"workers": 2, "worker_env": {}, "batcher_env": {}},
    # TGI-style admission (whole prompts in prefill-only steps) must not change results either.
    "tgi_policy": {"workers": 1, "worker_env": {}, "batcher_env": {"BATCHER_SCHEDULING_POLICY": "tgi"}},
    # 16 blocks of 16 tokens hold ~2 of the longest requests: preemption is certain, and a budget
    # of 32 tokens per step splits every longer prompt into chunks.
    "preempt_and_chunk": {
        "workers": 1,
        "worker_env": {"WORKER_NUM_BLOCKS": "16", "WORKER_BLOCK_SIZE": "16"},
        "batcher_env": {"BATCHER_MAX_NUM_BATCHED_TOKENS": "32", "BATCHER_MAX_NUM_SEQS": "8"},
    },
    # The same pressure with step N+1 scheduled while step N runs.
    "async_preempt_and_chunk": {
        "workers": 1,
        "worker_env": {"WORKER_NUM_BLOCKS": "16", "WORKER_BLOCK_SIZE": "16"},
        "batcher_env": {
            "BATCHER_MAX_NUM_BATCHED_TOKENS": "32",
            "BATCHER_MAX_NUM_SEQS": "8",
            "BATCHER_ASYNC_SCHEDULING": "true",
        },
    },
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_pipeline_matches_generate(
    config: str, make_stack: Callable[[], Stack], reference: Reference
) -> None:
    spec = CONFIGS[config]
    stack = make_stack().start_all(
        spec["workers"],  # type: ignore[arg-type]
        batcher_env=spec["batcher_env"],  # type: ignore[arg-type]
        worker_env=spec["worker_env"],  # type: ignore[arg-type]
    )
    stats = assert_matches_generate(stack, reference)
    if config == "two_workers":
        steps = {k: v for k, v in stats.items() if k.startswith("num_steps:")}
        assert len(steps) == 2 and all(n > 0 for n in steps.values()), f"both workers must compute: {steps}"
    if config.endswith("preempt_and_chunk"):
        assert stats["num_preemptions"] > 0
        assert stats["num_partial_prefills"] > 0
