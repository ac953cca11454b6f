"""The batcher's view of one worker: its KV pool, its running batch, its steps in flight. No I/O."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from batcher.core.kv.kv_cache_manager import KVCacheManager
from batcher.core.pooling import refusal
from batcher.core.request import Request
from batcher.core.spec_decode.auto_off import AutoOff
from batcher.core.step_clock import StepClock
from common.protocol import WorkerInfo


@dataclass(slots=True)
class WorkerState:
    info: WorkerInfo
    kv_cache_manager: KVCacheManager  # its KV blocks, as its requests hold them
    max_num_seqs: int  # the worker's registered limit, under the batcher's cap
    max_num_batched_tokens: int
    running: list[Request] = field(default_factory=list)  # in admission order: newest last
    to_free: list[str] = field(default_factory=list)  # req ids the worker must drop in its next step
    # (step_id, req_id -> tokens) of each step sent whose result has not arrived, oldest first
    in_flight: deque[tuple[int, dict[str, int]]] = field(default_factory=deque)
    step_id: int = 0
    clock: StepClock = field(default_factory=StepClock)  # when to plan its next step (async scheduling)
    steps_since_admission: int = 0  # tgi policy: TGI's `waiting_tokens`
    prefix_cache_queries: int = 0  # prompt tokens of admitted requests (recomputes included)
    prefix_cache_hits: int = 0  # of which found cached
    num_encoder_runs: int = 0  # images it encoded, as its results say (multimodal)
    num_encoder_cache_hits: int = 0  # images its steps found in its encoder cache
    # Declared dead and fenced: nothing more is sent to it; its results already written still count
    # until the WorkerLost marker behind them is read, then it is removed.
    fenced: bool = False
    auto_off: AutoOff | None = None  # whether its decodes draft (spec_decode/auto_off.py); None: never
    # LoRA adapters (cache keys) sent to it, least recently first: what it likely holds (lora.py).
    adapters_sent: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    @classmethod
    def register(
        cls,
        info: WorkerInfo,
        max_num_seqs: int | None,
        max_num_batched_tokens: int | None,
        enable_prefix_caching: bool = True,
    ) -> WorkerState:
        """A worker joining with its own limits, capped by the batcher's (None leaves one as is).
        Its cache starts empty: a worker that joins (or rejoins) holds no KV yet."""
        return cls(
            info=info,
            # A worker that pools every prompt token (mean, CLS) must compute them all: no cached prefix.
            kv_cache_manager=KVCacheManager(
                info.num_blocks, info.block_size, enable_prefix_caching and info.prefix_caching
            ),
            max_num_seqs=_capped(info.max_num_seqs, max_num_seqs),
            max_num_batched_tokens=_capped(info.max_num_batched_tokens, max_num_batched_tokens),
        )

    def can_host(self, req: Request) -> bool:
        """Whether this worker could ever run the request: its kind (pooling.py), and its whole pool
        holding the request alone."""
        if refusal(self.info, self.max_num_batched_tokens, req) is not None:
            return False
        # A pooling request samples nothing, so its prompt may take the whole context.
        if req.pooling_params is None and len(req.prompt_token_ids) >= self.info.max_model_len:
            return False
        longest = min(req.max_num_tokens, self.info.max_model_len)
        return self.kv_cache_manager.blocks_for(longest) <= self.kv_cache_manager.num_blocks


def _capped(limit: int, cap: int | None) -> int:
    return limit if cap is None else min(limit, cap)
