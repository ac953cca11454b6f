"""Admission's readiness check of the cell a request is placed in: a batcher serves it, and its Redis
has headroom. Refused with 503 and Retry-After before the request is written, instead of accepted and
left waiting (no batcher: nothing would ever schedule it or enforce its queue deadline) or written into
a Redis so full that the running requests could no longer write their tokens.

Each cell's reading is kept for `CACHE_S`, so a burst costs one round trip per cell, not one per
request; each request admitted also counts as the memory it may come to hold (`request_bytes`) for
`RESERVE_S`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from common.redis_io.batcher_liveness import BATCHER_SILENT_S, batcher_state
from gateway.limits.redis_memory import MemoryUse, memory_use
from openai_frontend.protocol.errors import OpenAIError

CACHE_S = 0.5
# A request admitted counts as what it may come to hold for this long, on top of what Redis reports:
# a burst admitted on one reading, or whose tokens are not written yet, cannot overrun the headroom.
# Counted twice once written (conservative); the headroom absorbs what runs longer.
RESERVE_S = 10.0
RETRY_AFTER_S = 2
# What a request may come to hold in Redis: a token event in its token stream (about 110 B measured),
# a prompt token in its request entry (msgpack), and its entry, record, marker and deadline entries.
BYTES_PER_OUTPUT_TOKEN = 128
BYTES_PER_PROMPT_TOKEN = 8
BYTES_PER_REQUEST = 2048


def request_bytes(
    num_requests: int, num_prompt_tokens: int, num_output_tokens: int, num_image_bytes: int = 0
) -> int:
    """The memory requests (the choices of one answer) may come to hold in Redis: what admission
    reserves for them. `num_image_bytes`: their images' tensors, which the requests stream carries."""
    num_bytes = num_requests * BYTES_PER_REQUEST + num_prompt_tokens * BYTES_PER_PROMPT_TOKEN
    return num_bytes + num_output_tokens * BYTES_PER_OUTPUT_TOKEN + num_image_bytes


def _unavailable(why: str, code: str) -> OpenAIError:
    message = f"{why}: new requests are refused until {_UNTIL[code]}. Please retry after {RETRY_AFTER_S}s."
    headers = {"Retry-After": str(RETRY_AFTER_S)}
    return OpenAIError(503, message, type="server_error", code=code, headers=headers)


_UNTIL = {"no_batcher": "one does", "redis_full": "running ones free memory"}


def no_batcher_error() -> OpenAIError:
    return _unavailable(
        f"no batcher has served this server's queue in the last {BATCHER_SILENT_S:g} s", "no_batcher"
    )


def redis_full_error(detail: str) -> OpenAIError:
    return _unavailable(f"the request queue is nearly full ({detail})", "redis_full")


@dataclass(slots=True)
class _Cell:
    taken_at: float = float("-inf")  # time.monotonic() of the last reading
    batcher_gone: bool = False
    memory: MemoryUse = field(default_factory=lambda: MemoryUse(0, 0))
    # (admitted at, bytes) of the requests admitted in the last RESERVE_S, oldest first
    reserved: deque[tuple[float, int]] = field(default_factory=deque)
    num_reserved_bytes: int = 0

    def expire(self, now: float) -> None:
        while self.reserved and now - self.reserved[0][0] >= RESERVE_S:
            self.num_reserved_bytes -= self.reserved.popleft()[1]


@dataclass(slots=True)
class CellGuard:
    memory_headroom: float  # share of maxmemory kept free for running requests
    _cells: dict[str, _Cell] = field(default_factory=dict)

    async def check(self, redis: aioredis.Redis, cell: str, num_bytes: int) -> None:
        """Raise the cell's refusal (503) if it should not take a new request that may come to hold
        `num_bytes`; else reserve them against its headroom for RESERVE_S."""
        now = time.monotonic()
        state = self._cells.setdefault(cell, _Cell())
        if now - state.taken_at >= CACHE_S:
            state.batcher_gone = await batcher_state(redis, cell) == "gone"
            state.memory = await memory_use(redis, cell)
            state.taken_at = now
        if state.batcher_gone:
            raise no_batcher_error()
        state.expire(now)
        if state.memory.over(self.memory_headroom, state.num_reserved_bytes + num_bytes):
            raise redis_full_error(state.memory.describe())
        state.reserved.append((now, num_bytes))
        state.num_reserved_bytes += num_bytes
