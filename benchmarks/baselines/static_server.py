"""The static-batching baseline behind an OpenAI-compatible surface.

python -m benchmarks.baselines.static_server --model models/tiny-llama --batch-size 8 --port 8100

Endpoints: `POST /v1/completions` (streaming SSE with `stream_options.include_usage`, or not),
`GET /v1/models`, `GET /health`, and `GET /stats` (batches run, padding computed). Body fields
honoured: `prompt` (text or token ids), `max_tokens`, `temperature`, `seed`, `ignore_eos`, `stream`,
`stream_options`; anything else is ignored. The batching itself lives in `static_engine`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from benchmarks.workloads.tokenizer import BenchTokenizer, IncrementalDecoder

if TYPE_CHECKING:
    from benchmarks.baselines.inprocess_engine import InProcessEngine
    from benchmarks.baselines.static_engine import EngineToken, StaticBatchEngine

log = logging.getLogger("benchmarks.baselines.static_server")

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: dict[str, Any] | None = None


@dataclass(slots=True)
class ServerState:
    engine: StaticBatchEngine | InProcessEngine
    tokenizer: BenchTokenizer
    served_name: str
    root: str
    max_model_len: int
    created: int = field(default_factory=lambda: int(time.time()))


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def _prompt_ids(
    prompt: str | list[int] | list[str] | list[list[int]], tokenizer: BenchTokenizer
) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise ValueError("only one prompt per request is supported")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    return [int(t) for t in prompt]  # type: ignore[arg-type]  # list[int] once the cases above are gone


def _validate(body: CompletionBody, state: ServerState) -> tuple[list[int], int] | JSONResponse:
    if body.model is not None and body.model != state.served_name:
        return _error(
            404, f"The model `{body.model}` does not exist; this server serves `{state.served_name}`."
        )
    try:
        prompt_ids = _prompt_ids(body.prompt, state.tokenizer)
    except ValueError as exc:
        return _error(400, str(exc), "prompt")
    if not prompt_ids:
        return _error(400, "prompt must not be empty", "prompt")
    if any(not 0 <= t < state.tokenizer.vocab_size for t in prompt_ids):
        return _error(400, f"token ids must be in [0, {state.tokenizer.vocab_size})", "prompt")
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    if max_tokens < 1:
        return _error(400, "max_tokens must be at least 1", "max_tokens")
    if len(prompt_ids) + max_tokens > state.max_model_len:
        return _error(
            400,
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the context "
            f"length {state.max_model_len}",
            "max_tokens",
        )
    return prompt_ids, max_tokens


def _sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


async def _events(
    state: ServerState, body: CompletionBody, prompt_ids: list[int], max_tokens: int
) -> AsyncIterator[EngineToken]:
    """Submit the request and yield its token events as the engine thread produces them."""
    from benchmarks.baselines.static_engine import GenerationRequest

    loop = asyncio.get_running_loop()
    events: asyncio.Queue[EngineToken] = asyncio.Queue()

    def emit(event: EngineToken) -> None:
        # After shutdown the loop is closed; the batch finishes regardless, its tokens go nowhere.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(events.put_nowait, event)

    state.engine.submit(
        GenerationRequest(
            req_id=uuid.uuid4().hex,
            prompt_token_ids=prompt_ids,
            max_tokens=max_tokens,
            ignore_eos=body.ignore_eos,
            temperature=body.temperature or 0.0,
            seed=body.seed,
            emit=emit,
        )
    )
    while True:
        event = await events.get()
        yield event
        if event.finish_reason is not None:
            return


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        try:
            yield
        finally:
            state.engine.stop()

    app = FastAPI(title="static-batching baseline", lifespan=lifespan)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {
            "id": state.served_name,
            "object": "model",
            "created": state.created,
            "owned_by": "benchmarks",
            "root": state.root,
            "max_model_len": state.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/stats")
    async def stats() -> JSONResponse:
        return JSONResponse(asdict(state.engine.stats))

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionBody) -> JSONResponse | StreamingResponse:
        checked = _validate(body, state)
        if isinstance(checked, JSONResponse):
            return checked
        prompt_ids, max_tokens = checked
        response_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {
            "id": response_id,
            "object": "text_completion",
            "created": created,
            "model": state.served_name,
        }
        include_usage = bool((body.stream_options or {}).get("include_usage"))

        def usage(num_tokens: int) -> dict[str, int]:
            total = len(prompt_ids) + num_tokens
            return {"prompt_tokens": len(prompt_ids), "completion_tokens": num_tokens, "total_tokens": total}

        def choice(text: str, finish_reason: str | None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

        if body.stream:

            async def stream() -> AsyncIterator[bytes]:
                decoder, num_tokens = IncrementalDecoder(state.tokenizer), 0
                async for event in _events(state, body, prompt_ids, max_tokens):
                    if event.error is not None:
                        yield _sse({"error": {"message": event.error, "type": "server_error"}})
                        return
                    num_tokens += 1
                    assert event.token_id is not None
                    # The EOS token is counted in usage but not shown, as in vLLM.
                    text = "" if event.finish_reason == "stop" else decoder.add(event.token_id)
                    yield _sse({**head, "choices": [choice(text, event.finish_reason)]})
                if include_usage:
                    yield _sse({**head, "choices": [], "usage": usage(num_tokens)})
                yield _sse("[DONE]")

            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

        token_ids: list[int] = []
        finish_reason: str | None = None
        async for event in _events(state, body, prompt_ids, max_tokens):
            if event.error is not None:
                return JSONResponse({"error": {"message": event.error, "type": "server_error"}}, 500)
            assert event.token_id is not None
            token_ids.append(event.token_id)
            finish_reason = event.finish_reason
        shown = token_ids[:-1] if finish_reason == "stop" else token_ids
        text = state.tokenizer.decode(shown)
        return JSONResponse(
            {**head, "choices": [choice(text, finish_reason)], "usage": usage(len(token_ids))}
        )

    return app


def load_state(args: argparse.Namespace) -> ServerState:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from benchmarks.baselines.static_engine import StaticBatchEngine

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    if args.engine == "inprocess":
        return load_inprocess_state(args)
    device = torch.device(args.device)
    dtype_name = args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, dtype_name))
    model.to(device)  # type: ignore[arg-type]  # transformers' decorated `.to` confuses mypy
    model.eval()
    config = AutoConfig.from_pretrained(args.model)
    try:
        generation = GenerationConfig.from_pretrained(args.model)
    except OSError:
        generation = GenerationConfig()
    eos = generation.eos_token_id if generation.eos_token_id is not None else config.eos_token_id
    eos_ids = set(eos) if isinstance(eos, list) else ({eos} if eos is not None else set())
    pad = generation.pad_token_id if generation.pad_token_id is not None else (min(eos_ids) if eos_ids else 0)
    engine = StaticBatchEngine(
        model,
        batch_size=args.batch_size,
        batch_timeout_s=args.batch_timeout_ms / 1000.0,
        eos_token_ids=eos_ids,
        pad_token_id=int(pad),
        device=device,
    )
    max_model_len = args.max_model_len or int(
        getattr(config.get_text_config(), "max_position_embeddings", 2048)
    )
    return ServerState(
        engine=engine,
        tokenizer=BenchTokenizer(args.model),
        served_name=args.served_model_name or Path(args.model).name,
        root=str(args.model),
        max_model_len=max_model_len,
    )


def load_inprocess_state(args: argparse.Namespace) -> ServerState:
    """Our scheduler + model runner in this process (the pipeline without Redis), same HTTP front."""
    from batcher.core.scheduler import SchedulerConfig
    from benchmarks.baselines.inprocess_engine import InProcessEngine
    from cbserve.offline.engine import LLMEngine
    from gpu_worker.settings import WorkerSettings

    engine = LLMEngine.load(
        WorkerSettings(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
        ),
        SchedulerConfig(scheduling_policy=args.scheduling_policy),
    )
    return ServerState(
        engine=InProcessEngine(engine),
        tokenizer=BenchTokenizer(args.model),
        served_name=args.served_model_name or Path(args.model).name,
        root=str(args.model),
        max_model_len=args.max_model_len or engine.max_model_len,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.baselines.static_server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", required=True, help="model directory (config, weights, tokenizer.json)")
    parser.add_argument(
        "--engine",
        choices=["static", "inprocess"],
        default="static",
        help="static: the static-batching baseline; inprocess: our scheduler + model runner without Redis",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="requests per static batch")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="inprocess: as WORKER_MAX_NUM_SEQS")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="inprocess: as WORKER_MAX_NUM_BATCHED_TOKENS"
    )
    parser.add_argument(
        "--scheduling-policy",
        choices=["fused", "tgi"],
        default="fused",
        help="inprocess: as BATCHER_SCHEDULING_POLICY",
    )
    parser.add_argument(
        "--batch-timeout-ms",
        type=float,
        default=50.0,
        help="how long the oldest waiting request waits for a full batch before a smaller one runs",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--num-threads", type=int, default=0, help="torch threads on cpu (0: torch default)")
    parser.add_argument(
        "--served-model-name", default=None, help="the `model` clients name (default: dir name)"
    )
    parser.add_argument("--max-model-len", type=int, default=0, help="0: max_position_embeddings")
    parser.add_argument("--log-level", default="warning")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    state = load_state(args)
    uvicorn.run(create_app(state), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
