"""One streamed `/v1/completions` request, timed the way `vllm bench serve` times it.

- TTFT: from sending the request to the first chunk that carries a choice.
- ITL: the gap between consecutive such chunks (a chunk may carry several tokens; the list is per
  chunk, as vLLM's is).
- E2E latency: from sending to the last chunk that carries a choice (the usage trailer is not a token).
- Output tokens: `usage.completion_tokens` of the final chunk; without usage, the token-bearing chunks.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from benchmarks.load.sse import SSEParser

Backend = Literal["openai", "transformers"]
BACKENDS: tuple[Backend, ...] = ("openai", "transformers")
PromptFormat = Literal["ids", "text"]


@dataclass(frozen=True, slots=True)
class RequestInput:
    prompt: list[int] | str  # token ids, or their text for servers that take only strings
    prompt_len: int  # tokens of the prompt as the benchmark counts them
    output_len: int  # max_tokens; with ignore_eos the server must return exactly this many
    model: str
    temperature: float = 0.0
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestOutput:
    success: bool = False
    prompt_len: int = 0
    output_len: int = 0  # asked for
    output_tokens: int = 0  # received (usage.completion_tokens)
    cached_tokens: int = 0  # prompt tokens the server served from its prefix cache (usage)
    ttft: float = 0.0  # seconds
    itl: list[float] = field(default_factory=list)  # seconds between token-bearing chunks
    latency: float = 0.0  # seconds, send to last token-bearing chunk
    start_time: float = 0.0  # perf_counter at send
    generated_text: str = ""
    error: str = ""


def completion_body(request: RequestInput, backend: Backend) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": request.model,
        "prompt": request.prompt,
        "max_tokens": request.output_len,
        "temperature": request.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if backend == "transformers":
        # `transformers serve` refuses unknown fields (so no `ignore_eos`) but takes a generation config;
        # with no EOS id, generation runs to max_new_tokens, which is what ignore_eos means.
        config: dict[str, Any] = {"max_new_tokens": request.output_len, "do_sample": request.temperature > 0}
        if request.ignore_eos:
            config["eos_token_id"] = None
        if request.temperature > 0:
            config["temperature"] = request.temperature
        body["generation_config"] = json.dumps(config)
    elif request.ignore_eos:
        body["ignore_eos"] = True
    body.update(request.extra_body)
    return body


def _is_token_chunk(data: dict[str, Any]) -> bool:
    """A chunk with a choice is a token, unless it is a usage trailer with no text (transformers serve
    sends its usage in a choice with empty text and the finish reason)."""
    choices = data.get("choices")
    if not choices:
        return False
    return not (data.get("usage") and not choices[0].get("text"))


async def send_completion(
    session: aiohttp.ClientSession, api_url: str, request: RequestInput, backend: Backend
) -> RequestOutput:
    output = RequestOutput(prompt_len=request.prompt_len, output_len=request.output_len)
    body = completion_body(request, backend)
    text_parts: list[str] = []
    usage_tokens: int | None = None
    first = True
    start = time.perf_counter()
    output.start_time = last = start
    try:
        async with session.post(api_url, json=body) as response:
            if response.status != 200:
                detail = (await response.text())[:500]
                output.error = f"HTTP {response.status}: {detail}"
                return output
            parser = SSEParser()
            async for chunk in response.content.iter_any():
                for payload in parser.feed(chunk):
                    if payload == "[DONE]":
                        continue
                    data = json.loads(payload)
                    if "error" in data:
                        output.error = f"error event: {json.dumps(data['error'])[:500]}"
                        return output
                    if _is_token_chunk(data):
                        now = time.perf_counter()
                        if first:
                            output.ttft = now - start
                            first = False
                        else:
                            output.itl.append(now - last)
                        last = now
                        text_parts.append(data["choices"][0].get("text") or "")
                    if usage := data.get("usage"):
                        usage_tokens = int(usage.get("completion_tokens") or 0)
                        if usage.get("prompt_tokens") is not None:
                            output.prompt_len = int(usage["prompt_tokens"])
                        details = usage.get("prompt_tokens_details") or {}
                        output.cached_tokens = int(details.get("cached_tokens") or 0)
    except Exception:
        output.error = traceback.format_exc(limit=3)
        return output
    output.generated_text = "".join(text_parts)
    if first:
        output.error = "the stream ended without a token"
        return output
    output.latency = last - start
    output.output_tokens = usage_tokens if usage_tokens is not None else 1 + len(output.itl)
    output.success = True
    return output
