"""An adapter is served wherever the base model is: with n-gram speculative decoding over HTTP
(streamed or not; the drafts are verified with the adapter), from a Celery task naming it as its
`model`, and on Batch API lines naming it. Each request's greedy tokens equal PEFT's own unmerged
`generate` for it alone. One batcher (drafting), one LoRA worker, a gateway serving three adapters
(GATEWAY_LORA_MODULES) and a Celery worker in this process, on a private Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from celery import Celery

from cbserve_celery.app import GENERATE_TASK
from harness.load.batch_runs import request_line
from harness.load.load_clients import completion_body
from harness.models.lora_adapters import peft_greedy
from harness.processes.celery_thread import celery_in_thread
from harness.processes.redis_server import redis_server
from harness.processes.services import Stack
from tests.stack.batch.test_batch_api import file_lines, run_batch
from tests.stack.e2e.test_e2e_spec_decode import NGRAM, PATTERN, complete

MAX_TOKENS = 24
# Repeated text (drafts get accepted) and a prompt with nothing repeated, each under every adapter.
PROMPTS = [PATTERN * 4, [*PATTERN[::-1], 77] * 3, [5, 6, 7, 8, 9, 10, 11]]
ADAPTERS = ("attn-r4", "mlp-rslora", "all-r16")


@pytest.fixture(scope="module")
def stack(
    tiny_model_dir: Path, lora_adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("lora-clients")
    with redis_server(log_dir) as url:
        s = Stack(redis_url=url, model_dir=tiny_model_dir, log_dir=log_dir)
        try:
            s.start_all(
                1,
                batcher_env={"SPECULATIVE_CONFIG": NGRAM, "BATCHER_MAX_NUM_BATCHED_TOKENS": "32"},
                worker_env={"WORKER_ENABLE_LORA": "true", "WORKER_MAX_LORAS": "3", "WORKER_BLOCK_SIZE": "16"},
                gateway_env={"GATEWAY_LORA_MODULES": " ".join(f"{n}={p}" for n, p in lora_adapters.items())},
            )
            yield s
        finally:
            s.stop()


@pytest.fixture(scope="module")
def expected(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> dict[str, list[list[int]]]:
    """Adapter name -> PEFT's greedy tokens of each prompt alone."""
    return {name: peft_greedy(tiny_model_dir, lora_adapters[name], PROMPTS, MAX_TOKENS) for name in ADAPTERS}


@pytest.fixture(scope="module")
def celery_app(stack: Stack) -> Iterator[Celery]:
    with celery_in_thread(stack.redis_url, stack.model_dir, request_timeout_s=120) as app:
        yield app


def _cases() -> list[tuple[str, int, list[int]]]:
    return [(name, j, prompt) for name in ADAPTERS for j, prompt in enumerate(PROMPTS)]


async def _all_adapters(stack: Stack) -> list[list[int]]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=httpx.Timeout(120.0)) as client:
        runs = [complete(client, n, p, MAX_TOKENS, stream=i % 2 == 0) for i, (n, _, p) in enumerate(_cases())]
        return await asyncio.wait_for(asyncio.gather(*runs), timeout=180)


def test_drafts_are_verified_with_each_adapter(stack: Stack, expected: dict[str, list[list[int]]]) -> None:
    got = asyncio.run(_all_adapters(stack))
    assert got == [tokens for name in ADAPTERS for tokens in expected[name]]
    assert stack.stats()["spec_decode_num_accepted_tokens"] > 0


def test_a_celery_task_names_an_adapter_as_its_model(
    celery_app: Celery, expected: dict[str, list[list[int]]]
) -> None:
    generate = celery_app.tasks[GENERATE_TASK]
    params = {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    results = {name: generate.delay(PROMPTS[0], params, model=name) for name in ADAPTERS}
    assert {name: r.get(timeout=120)["token_ids"] for name, r in results.items()} == {
        name: tokens[0] for name, tokens in expected.items()
    }
    with pytest.raises(Exception, match="neither in this worker's"):
        generate.delay(PROMPTS[0], params, model="no-such-adapter").get(timeout=60)


def test_batch_lines_name_adapters(
    stack: Stack, celery_app: Celery, expected: dict[str, list[list[int]]]
) -> None:
    lines = [
        request_line(
            f"{name}-{j}", {**completion_body(p, MAX_TOKENS, stream=False), "model": name}, "/v1/completions"
        )
        for name in ADAPTERS
        for j, p in enumerate(PROMPTS)
    ]
    with stack.sdk() as sdk:
        batch = run_batch(sdk, lines, "/v1/completions")
        assert batch.status == "completed", batch
        out = file_lines(sdk, batch.output_file_id)
    for name in ADAPTERS:
        for j, tokens in enumerate(expected[name]):
            body = out[f"{name}-{j}"]["response"]["body"]
            assert (body["model"], body["choices"][0]["token_ids"]) == (name, tokens), json.dumps(body)[:300]
