"""What the scheduler knows (workers, unfinished requests, the waiting queue) and the state changes
every scheduling decision shares: release, finish, fail, put back to wait. No I/O, no decisions."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from batcher.core.request import Request, RequestStatus
from batcher.core.spec_decode.drafting import make_suffix_cache
from batcher.core.waiting_queue import WaitingQueue
from batcher.core.worker_state import WorkerState
from common.protocol import FinishReason
from common.spec_decode.speculative_config import SpeculativeConfig

SchedulingPolicyName = Literal["fused", "tgi"]
WaitingOrder = Literal["fcfs", "lpm"]


@dataclass(slots=True)
class SchedulerConfig:
    # Caps on every worker's own limits (WorkerInfo.max_num_seqs, ...); None leaves them as registered.
    max_num_seqs: int | None = None  # requests in one worker's batch
    max_num_batched_tokens: int | None = None  # tokens computed in one step (prefill chunks + decodes)
    # "fused": vLLM-style steps mixing decodes and chunked prefills under the token budget.
    # "tgi": text-generation-inference's admission, whole prompts in prefill-only steps (policies/tgi.py).
    scheduling_policy: SchedulingPolicyName = "fused"
    waiting_served_ratio: float = 0.3  # tgi: admit only if floor(running * ratio) new requests fit
    max_waiting_tokens: int = 20  # tgi: ... unless the batch decoded this many steps since the last admission
    # Schedule a worker's step N+1 while step N runs (the worker feeds back the tokens it sampled),
    # so the worker never waits on the batcher's round trip.
    async_scheduling: bool = False
    # A request that fails alone on this many deliveries to a worker is given up (dead-lettered).
    max_deliveries: int = 3
    # Reuse the KV of full blocks whose tokens (and everything before them) match (kv/prefix_cache.py).
    enable_prefix_caching: bool = True
    # Placement (placement.py): a block still to prefill on a worker weighs this many of its free
    # blocks; 0 places by load alone.
    cache_overlap_weight: float = 1.0
    # A waiting request whose prefix a running request is still prefilling waits for it (prefix_wait.py).
    prefix_wait: bool = True
    # "fcfs": arrival order; "lpm": most cached tokens on the worker first (waiting_order.py).
    waiting_order: WaitingOrder = "fcfs"
    # vLLM's name: image embeddings one step may encode (multimodal.py); None: the worker's token budget.
    max_num_encoder_input_tokens: int | None = None
    # Decodes draft tokens for the worker to verify (spec_decode/); None: never.
    speculative: SpeculativeConfig | None = None

    @property
    def max_steps_in_flight(self) -> int:
        return 2 if self.async_scheduling else 1


@dataclass(slots=True)
class SchedulerStats:
    num_steps: int = 0
    num_preemptions: int = 0
    num_partial_prefills: int = 0  # prefill chunks that left part of the prompt for a later step
    num_finished: int = 0
    num_aborted: int = 0
    num_failed: int = 0
    num_retries: int = 0  # requests that failed alone on a worker and were queued again
    num_dead_lettered: int = 0  # requests given up after max_deliveries failures
    num_workers_lost: int = 0  # workers declared dead
    num_failovers: int = 0  # requests moved off a dead worker to be recomputed elsewhere
    num_queue_timeouts: int = 0  # never-scheduled requests failed at their queue deadline
    worker_busy_s: float = 0.0  # summed step_time of all results
    worker_idle_s: float = 0.0  # summed time workers waited for their next step
    num_steps_overlapped: int = 0  # steps launched while the worker's previous step ran on the device
    spec_decode_num_drafts: int = 0  # decodes sent with drafts
    spec_decode_num_draft_tokens: int = 0  # draft tokens sent
    spec_decode_num_accepted_tokens: int = 0  # of which the worker accepted

    def as_dict(self) -> dict[str, int | float]:
        """The counters by name, for the stats hash every step: `dataclasses.asdict` deep-copies and
        recurses, which cost the batcher's step loop for a flat row of numbers."""
        return {name: getattr(self, name) for name in _STATS_FIELDS}


_STATS_FIELDS = tuple(f.name for f in fields(SchedulerStats))


class SchedulerState:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.stats = SchedulerStats()
        self.workers: dict[str, WorkerState] = {}
        self.requests: dict[str, Request] = {}  # every unfinished request
        # Shared by all workers, in (priority, arrival) order; preempted ones go first in their priority.
        self.waiting = WaitingQueue()
        # Suffix decoding's recent requests (spec_decode/), when that is the method.
        self.suffix_cache = make_suffix_cache(config.speculative)

    def running_on(self, ws: WorkerState, req_id: str) -> Request | None:
        req = self.requests.get(req_id)
        if req is None or req.status is not RequestStatus.RUNNING or req.worker_id != ws.info.worker_id:
            return None
        return req

    def evict(self, ws: WorkerState, req: Request) -> None:
        """Take a running request off `ws` (blocks freed, the worker told to drop it) to wait again
        at the front of its priority, recomputed from prompt + tokens so far when admitted."""
        ws.running.remove(req)
        ws.kv_cache_manager.free(req)
        ws.to_free.append(req.req_id)
        reset(req)  # num_inflight_steps stays: admission waits for those results
        self.waiting.appendleft(req)

    def release(self, req: Request) -> None:
        """Give back whatever the request holds: its place in a queue, its blocks, its worker state."""
        if req.status is RequestStatus.RUNNING and req.worker_id is not None:
            ws = self.workers.get(req.worker_id)
            if ws is not None:
                ws.running.remove(req)
                ws.kv_cache_manager.free(req)
                ws.to_free.append(req.req_id)
        elif req.status is RequestStatus.WAITING and req in self.waiting:
            self.waiting.remove(req)
        req.block_ids = []
        self.requests.pop(req.req_id, None)

    def finish(self, req: Request, reason: FinishReason) -> None:
        self.release(req)
        mark_finished(req, reason)
        if self.suffix_cache is not None and reason in ("stop", "length"):
            self.suffix_cache.add(req.prompt_token_ids + req.output_token_ids)

    def fail(self, req: Request, message: str) -> None:
        self.release(req)
        mark_finished(req, "error")
        req.error = message
        self.stats.num_failed += 1


def reset(req: Request) -> None:
    """Back to a waiting request that holds nothing anywhere."""
    req.status = RequestStatus.WAITING
    req.block_ids = []
    req.num_cached_blocks = 0
    req.num_computed_tokens = 0
    req.num_output_placeholders = 0
    req.spec_token_ids = []
    req.worker_id = None


def mark_finished(req: Request, reason: FinishReason) -> None:
    req.status = RequestStatus.FINISHED
    req.finish_reason = reason
