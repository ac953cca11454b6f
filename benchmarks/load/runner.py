"""One benchmark run: a request list and its arrival times sent to one OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tqdm import tqdm

from benchmarks.load.client import Backend, PromptFormat, RequestInput, RequestOutput, send_completion
from benchmarks.load.spec_decode import counted_during, read_spec_counters
from benchmarks.workloads.datasets import SampleRequest
from benchmarks.workloads.tokenizer import BenchTokenizer
from common.spec_decode.spec_decode_stats import SpecDecodeCounts


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    base_url: str  # e.g. http://127.0.0.1:8000 (no /v1)
    backend: Backend = "openai"
    prompt_format: PromptFormat = "ids"
    model: str | None = None  # the `model` sent; None: the first entry of GET /v1/models
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into its bodies after --extra-body
    # vLLM bench's --lora-modules: the adapters the requests are spread over (request i names the
    # (i mod n)-th as its `model`); empty: every request names `model`.
    lora_modules: tuple[str, ...] = ()

    @property
    def api_url(self) -> str:
        return f"{self.base_url.rstrip('/')}/v1/completions"


@dataclass(frozen=True, slots=True)
class RunOptions:
    temperature: float = 0.0
    ignore_eos: bool = True
    max_concurrency: int | None = None
    num_warmups: int = 1  # untimed requests sent one by one first (they also fail a bad setup fast)
    request_timeout_s: float = 6 * 3600.0
    progress: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RunResult:
    target: Target
    model: str
    outputs: list[RequestOutput]
    duration_s: float
    start_time: float  # perf_counter at the first scheduled send
    spec_decode: SpecDecodeCounts | None = None  # the server's drafts during the run (warm-ups not)


async def served_model(session: aiohttp.ClientSession, base_url: str) -> str:
    url = f"{base_url.rstrip('/')}/v1/models"
    async with session.get(url) as response:
        response.raise_for_status()
        data = await response.json()
    models = data.get("data") or []
    if not models:
        raise RuntimeError(f"{url} lists no model; pass the model name explicitly")
    return str(models[0]["id"])


def build_inputs(
    requests: list[SampleRequest],
    target: Target,
    model: str,
    options: RunOptions,
    tokenizer: BenchTokenizer | None,
) -> list[RequestInput]:
    inputs: list[RequestInput] = []
    for index, request in enumerate(requests):
        prompt: list[int] | str = request.prompt_token_ids
        prompt_len = request.prompt_len
        if target.prompt_format == "text":
            if tokenizer is None:
                raise ValueError(f"{target.name}: --prompt-format text needs the model's tokenizer (--model)")
            prompt, prompt_len = tokenizer.text_prompt(request.prompt_token_ids)
        inputs.append(
            RequestInput(
                prompt=prompt,
                prompt_len=prompt_len,
                output_len=request.output_len,
                model=target.lora_modules[index % len(target.lora_modules)] if target.lora_modules else model,
                temperature=options.temperature,
                ignore_eos=options.ignore_eos,
                extra_body={**options.extra_body, **target.extra_body},
            )
        )
    return inputs


async def run(
    target: Target,
    requests: list[SampleRequest],
    arrivals: list[float],
    options: RunOptions,
    tokenizer: BenchTokenizer | None = None,
) -> RunResult:
    if len(arrivals) != len(requests):
        raise ValueError("one arrival time per request")
    limit = options.max_concurrency or 0
    # One connection per request: a server that closes kept-alive connections on its own schedule
    # (llama-server after a few requests) would fail the next request sent on one ("Server
    # disconnected" before it was read). A local connect costs well under a millisecond.
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, force_close=True)
    timeout = aiohttp.ClientTimeout(total=options.request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        model = target.model or await served_model(session, target.base_url)
        inputs = build_inputs(requests, target, model, options, tokenizer)
        for _ in range(options.num_warmups):
            warmup = await send_completion(session, target.api_url, inputs[0], target.backend)
            if not warmup.success:
                raise RuntimeError(f"{target.name}: the warm-up request failed: {warmup.error}")
        spec_before = await read_spec_counters(session, target.base_url)
        semaphore = asyncio.Semaphore(options.max_concurrency) if options.max_concurrency else None
        progress = tqdm(total=len(inputs), desc=target.name, disable=not options.progress, leave=False)

        async def one(request: RequestInput) -> RequestOutput:
            if semaphore is None:
                output = await send_completion(session, target.api_url, request, target.backend)
            else:
                async with semaphore:
                    output = await send_completion(session, target.api_url, request, target.backend)
            progress.update(1)
            return output

        tasks: list[asyncio.Task[RequestOutput]] = []
        start = time.perf_counter()
        for request, arrival in zip(inputs, arrivals, strict=True):
            delay = start + arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival schedule itself, not a wait for a condition
            tasks.append(asyncio.create_task(one(request)))
        outputs = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - start
        progress.close()
        spec_decode = counted_during(spec_before, await read_spec_counters(session, target.base_url))
    return RunResult(
        target=target,
        model=model,
        outputs=outputs,
        duration_s=duration,
        start_time=start,
        spec_decode=spec_decode,
    )
