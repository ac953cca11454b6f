"""LoRA adapters through the real pipeline: a batcher, two workers and a gateway (processes) on a
private Redis. Requests for three adapters and the base model, mixed in steps and streamed, give the
very tokens PEFT's own unmerged `generate` gives each alone: as `GenerateRequest`s carrying a
`LoRARequest` on the requests stream, followed on their token streams; as completions over HTTP
naming the adapter as their `model` (GATEWAY_LORA_MODULES); and again after one worker is killed
mid-stream (recomputed elsewhere, adapter and all). An adapter the workers cannot read fails its
request with a RequestError; `LLM` with the compiled forward (inductor) gives the same tokens.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from common.protocol import GenerateRequest, LoRARequest, SamplingParams
from common.stream_client import follow, new_req_id, submit
from common.token_rules import RequestFailed
from harness.load import fault_clients as fault
from harness.processes.redis_server import redis_server
from harness.processes.services import Stack, wait_for
from tests.unit.cbserve.test_llm_lora import ADAPTER_OF, MAX_TOKENS, expected_tokens, lora_prompts

LORA_WORKER_ENV = {
    **fault.WORKER_ENV,
    "WORKER_ENABLE_LORA": "true",
    "WORKER_MAX_LORAS": "2",  # fewer slots than adapters: requests wait for one while others run
    "WORKER_MAX_CPU_LORAS": "3",
    "WORKER_NUM_BLOCKS": "96",
    "WORKER_BLOCK_SIZE": "4",
    "WORKER_MAX_NUM_BATCHED_TOKENS": "24",  # the longer prompts are chunked
    "WORKER_MAX_NUM_SEQS": "8",
}
LONG_TOKENS = 40  # the failover test's: long enough that the kill lands mid-stream
WORKERS = ("worker0", "worker1")


@pytest.fixture(scope="module")
def expected(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> list[list[int]]:
    return expected_tokens(tiny_model_dir, lora_adapters, lora_prompts(), LONG_TOKENS)


@pytest.fixture(scope="module")
def stack(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """A batcher (fast failure detection), two LoRA workers and a gateway serving the adapters by name,
    for the module (the failover test, which kills a worker, runs last)."""
    log_dir = tmp_path_factory.mktemp("lora-stack")
    with redis_server(log_dir) as url:
        s = Stack(redis_url=url, model_dir=tiny_model_dir, log_dir=log_dir)
        try:
            s.start_batcher(**fault.FAST_HEARTBEAT_ENV)
            for name in WORKERS:
                s.start_worker(name, WORKER_WORKER_ID=name, **LORA_WORKER_ENV)

            def joined() -> bool:
                s.check_alive()
                return s.num_workers_joined() >= 2

            wait_for(joined, 120, "two LoRA workers to join")
            adapters = request.getfixturevalue("lora_adapters")
            s.start_gateway(
                GATEWAY_LORA_MODULES=" ".join(f"{n}={p}" for n, p in adapters.items()),
                GATEWAY_ALLOW_RUNTIME_LORA_UPDATING="true",
            )
            s.wait_ready(num_workers=2)
            yield s
        finally:
            s.stop()


def adapter_requests(adapters: dict[str, Path]) -> list[LoRARequest | None]:
    return [None if a is None else LoRARequest(lora_name=a, lora_path=str(adapters[a])) for a in ADAPTER_OF]


def submit_one(r: redis.Redis, prompt: list[int], max_tokens: int, lora: LoRARequest | None) -> str:
    request = GenerateRequest(
        req_id=new_req_id(),
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        arrival_time=time.time(),
        lora_request=lora,
    )
    submit(r, request)
    return request.req_id


def submit_all(r: redis.Redis, adapters: dict[str, Path], max_tokens: int) -> list[str]:
    loras = adapter_requests(adapters)
    return [submit_one(r, p, max_tokens, lora) for p, lora in zip(lora_prompts(), loras, strict=True)]


def test_mixed_adapters_stream_the_tokens_peft_gives(
    stack: Stack, lora_adapters: dict[str, Path], expected: list[list[int]]
) -> None:
    r = stack.redis()
    req_ids = submit_all(r, lora_adapters, MAX_TOKENS)
    streamed = [[e.token_id for e in follow(r, req_id, timeout_s=120)] for req_id in req_ids]
    assert streamed == [tokens[:MAX_TOKENS] for tokens in expected]
    assert stack.stats_after(len(req_ids))["num_failed"] == 0


def test_adapters_named_as_the_model_over_http_stream_the_tokens_peft_gives(
    stack: Stack, tiny_model_dir: Path, expected: list[list[int]]
) -> None:
    models = [tiny_model_dir.name if a is None else a for a in ADAPTER_OF]

    async def stream_all() -> list[fault.ClientStream]:
        seen = [fault.ClientStream() for _ in models]
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=httpx.Timeout(120.0)) as client:
            await asyncio.gather(
                *(
                    fault.stream_completion(client, prompt, MAX_TOKENS, s, model=model)
                    for prompt, s, model in zip(lora_prompts(), seen, models, strict=True)
                )
            )
        return seen

    seen = asyncio.run(stream_all())
    assert [s.errors for s in seen] == [[]] * len(models)
    assert [s.token_ids for s in seen] == [tokens[:MAX_TOKENS] for tokens in expected]


def test_an_adapter_the_workers_cannot_read_fails_its_request(stack: Stack, tmp_path: Path) -> None:
    r = stack.redis()
    gone = submit_one(r, [5, 6, 7], 4, LoRARequest(lora_name="gone", lora_path=str(tmp_path / "gone")))
    with pytest.raises(RequestFailed, match=r"LoRA adapter .gone. cannot be served: .* no such directory"):
        list(follow(r, gone, timeout_s=60))
    # The workers live on and serve the next request.
    assert len(list(follow(r, submit_one(r, [5, 6, 7], 2, None), timeout_s=60))) == 2
    stack.check_alive()


def test_an_adapter_loaded_and_unloaded_at_run_time_while_others_stream(
    stack: Stack, tiny_model_dir: Path, lora_adapters: dict[str, Path], expected: list[list[int]]
) -> None:
    """The static adapters' and the base model's requests stream throughout; an adapter loaded
    meanwhile serves PEFT's tokens, and unloading it mid-stream lets its running request finish
    while a new one naming it is a 404."""
    models = [tiny_model_dir.name if a is None else a for a in ADAPTER_OF]
    runtime = {"lora_name": "attn-at-run-time", "lora_path": str(lora_adapters["attn-r4"])}
    prompt = lora_prompts()[0]  # attn-r4's in ADAPTER_OF: the same adapter under another name

    async def run() -> tuple[list[fault.ClientStream], fault.ClientStream]:
        seen = [fault.ClientStream() for _ in models]
        loaded = fault.ClientStream()
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=httpx.Timeout(120.0)) as client:
            others = [
                asyncio.create_task(fault.stream_completion(client, p, LONG_TOKENS, s, model=m))
                for p, s, m in zip(lora_prompts(), seen, models, strict=True)
            ]
            response = await client.post("/v1/load_lora_adapter", json=runtime)
            assert response.status_code == 200, response.text
            task = asyncio.create_task(
                fault.stream_completion(client, prompt, LONG_TOKENS, loaded, model=runtime["lora_name"])
            )
            deadline = time.monotonic() + 60
            while not loaded.token_ids and not task.done():  # unload once it is mid-stream
                assert time.monotonic() < deadline, "the runtime adapter's first token"
                await asyncio.sleep(0.01)
            response = await client.post("/v1/unload_lora_adapter", json={"lora_name": runtime["lora_name"]})
            assert response.status_code == 200, response.text
            body = {"model": runtime["lora_name"], "prompt": prompt, "max_tokens": 2}
            refused = await client.post("/v1/completions", json=body)
            assert refused.status_code == 404, refused.text
            await asyncio.gather(task, *others)
        return seen, loaded

    seen, loaded = asyncio.run(run())
    assert [s.errors for s in seen] == [[]] * len(models) and loaded.errors == []
    assert [s.token_ids for s in seen] == expected
    assert loaded.token_ids == expected[0]


def test_a_killed_workers_adapter_requests_resume_elsewhere(
    stack: Stack, lora_adapters: dict[str, Path], expected: list[list[int]]
) -> None:
    r = stack.redis()
    before = stack.stats()
    req_ids = submit_all(r, lora_adapters, LONG_TOKENS)
    streams = [iter(follow(r, req_id, timeout_s=120)) for req_id in req_ids]
    # Every stream has a few tokens before the kill, so every request is mid-stream on a worker.
    streamed = [[next(s).token_id for _ in range(3)] for s in streams]
    after = stack.stats()
    # The worker that ran more of these steps holds requests (placement may have put them all on one).
    busiest = max(WORKERS, key=lambda w: after.get(f"num_steps:{w}", 0) - before.get(f"num_steps:{w}", 0))
    stack.procs[busiest].send_signal(signal.SIGKILL)
    wait_for(lambda: stack.stats().get("num_workers_lost", 0) >= 1, 30, "the batcher to notice the kill")
    for tokens, s in zip(streamed, streams, strict=True):
        tokens.extend(e.token_id for e in s)
    assert streamed == expected
    stats = stack.stats_after(int(before["num_finished"]) + len(req_ids))
    assert stats["num_failovers"] > 0 and stats["num_failed"] == 1, stats


def test_compiled_llm_equals_peft(
    tiny_model_dir: Path,
    lora_adapters: dict[str, Path],
    expected: list[list[int]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`LLM` with the inductor-compiled forward (here: compiling takes tens of seconds): one graph
    for every step, the adapters' slots and each token's slot among its inputs."""
    from torch._dynamo.utils import counters

    from gpu_worker.runner.forward.decoder import Decoder
    from gpu_worker.runner.forward.precompiled import PrecompiledForward
    from tests.unit.cbserve.test_llm_lora import generate_mixed, mixed_llm

    monkeypatch.setenv("WORKER_COMPILE", "true")
    monkeypatch.setenv("WORKER_COMPILE_CACHE_DIR", str(tmp_path))
    counters.clear()
    llm = mixed_llm(tiny_model_dir)
    decoder = llm.llm_engine.runner.model
    assert isinstance(decoder, Decoder) and isinstance(decoder.run, PrecompiledForward)
    assert generate_mixed(llm, lora_adapters) == [tokens[:MAX_TOKENS] for tokens in expected]
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
