"""Static batching: fixed batches in arrival order, each run until its longest member is done.

The baseline continuous batching is measured against. A batch forms when `batch_size` requests wait,
or when the oldest waiting request has waited `batch_timeout_s`; it is left-padded and decoded
greedily (or sampled, for requests with a temperature) with one `model.forward` per step over the
whole batch and a `DynamicCache`. Members that reached their `max_tokens` keep being computed, as in
`model.generate` on a padded batch, until the longest member ends; only then does the next batch
start. Tokens are handed to `emit` as they are produced, so clients see them streamed.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

log = logging.getLogger("benchmarks.baselines.static_engine")

_IDLE_POLL_S = 0.1  # how often an idle engine thread looks at its stop flag


@dataclass(frozen=True, slots=True)
class EngineToken:
    """One token (or the error) a benchmark engine hands a request; not the wire's TokenEvent."""

    token_id: int | None  # None only for an error
    finish_reason: str | None = None  # "length" / "stop" on the request's last token
    error: str | None = None


@dataclass(slots=True)
class GenerationRequest:
    req_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    temperature: float
    seed: int | None
    emit: Callable[[EngineToken], None]  # called on the engine thread; must not block
    arrival_time: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class EngineStats:
    num_batches: int = 0
    num_requests: int = 0
    num_steps: int = 0  # forward passes
    num_padding_token_steps: int = 0  # rows computed after their request had finished
    batch_sizes: list[int] = field(default_factory=list)


class EngineThread:
    """What every benchmark engine shares: requests arrive on a queue, one daemon thread runs `_loop`."""

    def __init__(self, thread_name: str) -> None:
        self._waiting: queue.Queue[GenerationRequest] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def submit(self, request: GenerationRequest) -> None:
        self._waiting.put(request)

    def _loop(self) -> None:
        raise NotImplementedError


@dataclass(slots=True)
class _Row:
    request: GenerationRequest
    generator: torch.Generator | None
    num_emitted: int = 0
    done: bool = False


class StaticBatchEngine(EngineThread):
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        batch_size: int,
        batch_timeout_s: float,
        eos_token_ids: set[int],
        pad_token_id: int,
        device: torch.device,
    ) -> None:
        if batch_size < 1:
            raise ValueError("--batch-size must be at least 1")
        self.model = model
        self.batch_size = batch_size
        self.batch_timeout_s = batch_timeout_s
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = pad_token_id
        self.device = device
        self.stats = EngineStats()
        # transformers 5 renamed `past_key_values` to `cache` (the old name warns); 4.x knows only the old.
        self._cache_key = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )
        super().__init__("static-batch-engine")

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self._form_batch()
            if batch:
                self._run_batch(batch)

    def _form_batch(self) -> list[GenerationRequest]:
        """The oldest waiting requests, up to batch_size; waits at most batch_timeout for a full batch."""
        try:
            first = self._waiting.get(timeout=_IDLE_POLL_S)
        except queue.Empty:
            return []
        batch = [first]
        deadline = first.arrival_time + self.batch_timeout_s
        while len(batch) < self.batch_size:
            remaining = deadline - time.monotonic()
            try:
                # Past the deadline, still take whatever is already waiting.
                if remaining > 0:
                    batch.append(self._waiting.get(timeout=remaining))
                else:
                    batch.append(self._waiting.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run_batch(self, batch: list[GenerationRequest]) -> None:
        self.stats.num_batches += 1
        self.stats.num_requests += len(batch)
        self.stats.batch_sizes.append(len(batch))
        rows = [_Row(r, self._generator(r)) for r in batch]
        try:
            with torch.inference_mode():
                self._decode(rows)
        except Exception as exc:
            log.exception("batch of %d failed", len(batch))
            for row in rows:
                if not row.done:
                    row.request.emit(EngineToken(None, "error", error=f"{type(exc).__name__}: {exc}"))

    def _generator(self, request: GenerationRequest) -> torch.Generator | None:
        if request.temperature <= 0:
            return None
        generator = torch.Generator(device=self.device)
        if request.seed is not None:
            generator.manual_seed(request.seed)
        else:
            generator.seed()
        return generator

    def _decode(self, rows: list[_Row]) -> None:
        prompts = [row.request.prompt_token_ids for row in rows]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):  # left padding: every row's last token is at the end
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[i, width - len(prompt) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        max_new_tokens = max(row.request.max_tokens for row in rows)
        past = None
        for step in range(max_new_tokens):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_key: past},
            )
            self.stats.num_steps += 1
            past = out[self._cache_key]
            next_ids = self._select(out.logits[:, -1, :], rows)
            self._emit(rows, next_ids.tolist())
            if all(row.done for row in rows) or step == max_new_tokens - 1:
                return
            self.stats.num_padding_token_steps += sum(1 for row in rows if row.done)
            input_ids = next_ids[:, None]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(rows), 1))], dim=1)
            position_ids = position_ids[:, -1:] + 1

    def _select(self, logits: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
        next_ids = logits.argmax(dim=-1)
        for i, row in enumerate(rows):
            if row.generator is not None and not row.done:
                probs = torch.softmax(logits[i].float() / row.request.temperature, dim=-1)
                next_ids[i] = torch.multinomial(probs, 1, generator=row.generator)[0]
        return next_ids

    def _emit(self, rows: list[_Row], token_ids: list[int]) -> None:
        for row, token_id in zip(rows, token_ids, strict=True):
            if row.done:
                continue
            row.num_emitted += 1
            finish: str | None = None
            if not row.request.ignore_eos and token_id in self.eos_token_ids:
                finish = "stop"
            elif row.num_emitted >= row.request.max_tokens:
                finish = "length"
            row.done = finish is not None
            row.request.emit(EngineToken(token_id, finish))
