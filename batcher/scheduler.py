"""Iteration-level scheduling (Orca-style continuous batching) for any number of workers. No I/O.

Every call to `schedule(worker_id)` rebuilds that worker's next batch: its running requests first
(decodes and unfinished prefill chunks), then waiting requests from the shared queue, all under
its own `max_num_seqs` and token budget of `max_num_batched_tokens` (registered by the worker, so
CPU and GPU workers of any size coexist); a prompt longer than the budget left is
computed in chunks over several steps while decodes keep going. When a worker's KV blocks run out, the
least urgent running request (highest `priority` number, then most recently admitted) is preempted and
later recomputed from prompt + tokens so far. Waiting requests are admitted in (priority, arrival) order,
and a waiting request that no worker has room for preempts less urgent running ones (batch lines give
way to an interactive request instead of making it wait for one of them to finish).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from batcher.block_manager import BlockManager
from batcher.request import Request, RequestStatus
from batcher.waiting_queue import WaitingQueue
from common.protocol import (
    CachedRequestData,
    FinishReason,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    WorkerInfo,
)

# An abort can reach the batcher before the request it cancels; remember it this long (seconds).
EARLY_ABORT_TTL_S = 300.0


Policy = Literal["fused", "tgi"]


@dataclass(slots=True)
class SchedulerConfig:
    # Caps on every worker's own limits (WorkerInfo.max_num_seqs, ...); None leaves them as registered.
    max_num_seqs: int | None = None  # requests in one worker's batch
    max_num_batched_tokens: int | None = None  # tokens computed in one step (prefill chunks + decodes)
    # "fused": vLLM-style steps mixing decodes and chunked prefills under the token budget.
    # "tgi": text-generation-inference's admission, whole prompts in prefill-only steps (see _schedule_tgi).
    policy: Policy = "fused"
    waiting_served_ratio: float = 0.3  # tgi: admit only if floor(running * ratio) new requests fit
    max_waiting_tokens: int = 20  # tgi: ... unless the batch decoded this many steps since the last admission
    # Schedule a worker's step N+1 while step N runs (the worker feeds back the tokens it sampled),
    # so the worker never waits on the batcher's round trip.
    async_scheduling: bool = False
    # A request that fails alone on this many deliveries to a worker is given up (dead-lettered).
    max_deliveries: int = 3

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


@dataclass(slots=True)
class WorkerState:
    info: WorkerInfo
    block_manager: BlockManager
    max_num_seqs: int  # the worker's registered limit, under the batcher's cap
    max_num_batched_tokens: int
    running: list[Request] = field(default_factory=list)  # in admission order: newest last
    to_free: list[str] = field(default_factory=list)  # req ids the worker must drop in its next step
    # (step_id, req_id -> tokens) of each step sent whose result has not arrived, oldest first
    in_flight: deque[tuple[int, dict[str, int]]] = field(default_factory=deque)
    step_id: int = 0
    steps_since_admission: int = 0  # tgi policy: TGI's `waiting_tokens`
    # Declared dead and fenced: nothing more is sent to it; its results already written still count
    # until the WorkerLost marker behind them is read, then it is removed.
    fenced: bool = False

    def can_host(self, req: Request) -> bool:
        """Whether this worker's whole pool could ever hold the request alone."""
        if len(req.prompt_token_ids) >= self.info.max_model_len:
            return False
        longest = min(req.max_num_tokens, self.info.max_model_len)
        return self.block_manager.blocks_for(longest) <= self.block_manager.num_blocks


def _capped(limit: int, cap: int | None) -> int:
    return limit if cap is None else min(limit, cap)


def _priority(req: Request) -> int:
    return req.priority


def _preemption_victim(running: list[Request]) -> Request:
    """The least urgent running request (highest priority number), the most recently admitted on a tie."""
    return max(reversed(running), key=_priority)  # max keeps the first maximum: the newest


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.stats = SchedulerStats()
        self.workers: dict[str, WorkerState] = {}
        self.requests: dict[str, Request] = {}  # every unfinished request
        # Shared by all workers, in (priority, arrival) order; preempted ones go first in their priority.
        self.waiting = WaitingQueue()
        self._early_aborts: dict[str, tuple[float, str]] = {}  # req_id -> (when, reason)

    # ----- workers -------------------------------------------------------------------------------
    def add_worker(self, info: WorkerInfo) -> None:
        if info.worker_id not in self.workers:
            cfg = self.config
            self.workers[info.worker_id] = WorkerState(
                info=info,
                block_manager=BlockManager(info.num_blocks, info.block_size),
                max_num_seqs=_capped(info.max_num_seqs, cfg.max_num_seqs),
                max_num_batched_tokens=_capped(info.max_num_batched_tokens, cfg.max_num_batched_tokens),
            )

    def fence_worker(self, worker_id: str) -> None:
        """Stop scheduling a worker declared dead; `remove_worker` follows once its last results are in."""
        ws = self.workers.get(worker_id)
        if ws is not None and not ws.fenced:
            ws.fenced = True
            self.stats.num_workers_lost += 1

    def remove_worker(self, worker_id: str) -> list[Request]:
        """Forget a dead worker; its requests wait again (oldest first) to be recomputed elsewhere."""
        ws = self.workers.pop(worker_id, None)
        if ws is None:
            return []
        # Its steps in flight will never answer: nothing may wait for them (a request preempted off
        # this worker while a step ran is held back from admission until that step's result).
        for _, scheduled in ws.in_flight:
            for req_id in scheduled:
                req = self.requests.get(req_id)
                if req is not None and req.num_inflight_steps:
                    req.num_inflight_steps -= 1
        orphans = list(ws.running)
        for req in reversed(orphans):
            self._reset(req)
            req.num_inflight_steps = 0
            self.waiting.appendleft(req)
        self.stats.num_failovers += len(orphans)
        return orphans

    # ----- requests ------------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> list[Request]:
        """Queue a request; returns it already finished when an abort for it came first."""
        self._expire_early_aborts(now)
        if req.req_id in self.requests:
            return []  # delivered twice (e.g. re-read after a restart): keep the one we have
        early = self._early_aborts.pop(req.req_id, None)
        if early is not None:
            self._mark_finished(req, "stop" if early[1] == "stop" else "abort")
            self.stats.num_aborted += 1
            return [req]
        req.queued_at = now
        self.requests[req.req_id] = req
        self.waiting.append(req)
        return []

    def abort_request(self, req_id: str, reason: str, now: float) -> Request | None:
        req = self.requests.get(req_id)
        if req is None:
            self._early_aborts[req_id] = (now, reason)
            return None
        self._finish(req, "stop" if reason == "stop" else "abort")
        self.stats.num_aborted += 1
        return req

    def expire_waiting(self, now: float) -> list[Request]:
        """Fail the requests still waiting for their first step past their queue deadline.

        Only never-scheduled ones: a preempted or orphaned request has streamed tokens or held a slot,
        and failing it now would waste that work and break what its client already received.
        """
        expired = [
            req
            for req in self.waiting
            if req.queue_deadline is not None and now > req.queue_deadline and req.attempt == 0
        ]
        for req in expired:
            waited = now - req.arrival_time
            self._fail(req, f"the request waited {waited:.0f} s in the queue without being scheduled")
            req.error_code = "queue_timeout"
            self.stats.num_queue_timeouts += 1
        return expired

    @property
    def num_running(self) -> int:
        return sum(len(ws.running) for ws in self.workers.values())

    # ----- one step ------------------------------------------------------------------------------
    def schedule(self, worker_id: str) -> tuple[SchedulerOutput | None, list[Request]]:
        """The next step for `worker_id` (None when it has nothing to compute) and requests failed now."""
        ws = self.workers[worker_id]
        if ws.fenced:
            return None, []
        assert len(ws.in_flight) < self.config.max_steps_in_flight, "too many steps in flight"
        budget = ws.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        cached: list[CachedRequestData] = []
        new: list[NewRequestData] = []
        failed: list[Request] = []

        self._preempt_for_waiting(ws)
        if self.config.policy == "tgi":
            self._schedule_tgi(ws, num_scheduled, cached, new, failed)
        else:
            budget, preempted = self._schedule_running(ws, budget, num_scheduled, cached)
            if not preempted:
                self._schedule_waiting(ws, budget, num_scheduled, new, failed)

        if not num_scheduled:
            return None, failed
        ws.step_id += 1
        ws.in_flight.append((ws.step_id, dict(num_scheduled)))
        for req_id, n in num_scheduled.items():
            self._account_scheduled(self.requests[req_id], n)
        self.stats.num_steps += 1
        out = SchedulerOutput(
            step_id=ws.step_id,
            scheduled_new_reqs=new,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=ws.to_free,
        )
        ws.to_free = []
        return out, failed

    def _preempt_for_waiting(self, ws: WorkerState) -> None:
        """A waiting request that no worker has room for takes the place of less urgent running ones.

        vLLM's priority policy: an interactive request must not wait for a batch line to finish. The
        victims (least urgent, newest first) go back to the front of their own level, to be
        recomputed; requests of equal priority never preempt each other here.
        """
        if not self.waiting:
            return
        head = self.waiting[0]
        if (
            head.num_inflight_steps
            or not ws.can_host(head)
            or any(self._has_room(w, head) for w in self.workers.values())
        ):
            return
        while not self._has_room(ws, head):
            victim = _preemption_victim(ws.running) if ws.running else None
            if victim is None or victim.priority <= head.priority:
                return
            self._preempt(ws, victim)

    def _has_room(self, ws: WorkerState, req: Request) -> bool:
        """`ws` could admit `req` now: a free slot and blocks for its first chunk."""
        if not self._eligible(ws) or not ws.can_host(req):
            return False
        num_new = min(req.num_tokens - req.num_computed_tokens, ws.max_num_batched_tokens)
        need = ws.block_manager.num_new_blocks(len(req.block_ids), req.num_computed_tokens + num_new)
        return need <= ws.block_manager.num_free_blocks

    def _schedule_running(
        self,
        ws: WorkerState,
        budget: int,
        num_scheduled: dict[str, int],
        cached: list[CachedRequestData],
    ) -> tuple[int, bool]:
        bm = ws.block_manager
        preempted = False
        # Most urgent first (admission order within a priority): budget goes to interactive requests
        # before batch lines, and a preemption victim is always one not yet scheduled in this step.
        for req in sorted(ws.running, key=_priority):
            if budget <= 0 or req.status is not RequestStatus.RUNNING:
                break  # no budget left, or it was preempted (then so was everything after it)
            num_new = min(req.num_tokens_with_placeholders - req.num_computed_tokens, budget)
            if num_new <= 0 or req.is_finishing:
                continue
            need = bm.num_new_blocks(len(req.block_ids), req.num_computed_tokens + num_new)
            while need > bm.num_free_blocks:
                victim = _preemption_victim(ws.running)
                self._preempt(ws, victim)
                preempted = True
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                break  # it preempted itself: nothing after it is left either
            new_block_ids = bm.allocate(need)
            req.block_ids.extend(new_block_ids)
            cached.append(
                CachedRequestData(
                    req_id=req.req_id,
                    new_block_ids=new_block_ids,
                    num_computed_tokens=req.num_computed_tokens,
                )
            )
            self._count_chunk(req, num_new)
            num_scheduled[req.req_id] = num_new
            budget -= num_new
        return budget, preempted

    def _schedule_waiting(
        self,
        ws: WorkerState,
        budget: int,
        num_scheduled: dict[str, int],
        new: list[NewRequestData],
        failed: list[Request],
    ) -> int:
        bm = ws.block_manager
        share = self._fair_share(ws)
        admitted = 0
        while self.waiting and budget > 0 and len(ws.running) < ws.max_num_seqs:
            req = self.waiting[0]
            if req.num_inflight_steps:
                break  # preempted while a step ran: its last token is still on the way
            if not ws.can_host(req):
                if any(w.can_host(req) for w in self.workers.values()):
                    break  # a larger worker will take it; keep arrival order
                self.waiting.popleft()
                self._fail(req, "the request needs more KV-cache blocks than any worker has")
                failed.append(req)
                continue
            # New requests go to the worker with the most free blocks; a burst is split by free share.
            if admitted >= share and self._best_worker(req, prefer=ws) is not ws:
                break
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            need = bm.num_new_blocks(len(req.block_ids), req.num_computed_tokens + num_new)
            if need > bm.num_free_blocks:
                break
            self._admit(ws, num_new, num_scheduled, new)
            budget -= num_new
            admitted += 1
        return budget

    def _schedule_tgi(
        self,
        ws: WorkerState,
        num_scheduled: dict[str, int],
        cached: list[CachedRequestData],
        new: list[NewRequestData],
        failed: list[Request],
    ) -> None:
        """TGI's admission rule (text-generation-inference, backends/v3/src/backend.rs).

        New requests are prefilled whole, in a step of their own (the running batch waits), and only
        when at least floor(running * waiting_served_ratio) of them fit, unless the running batch has
        decoded `max_waiting_tokens` steps since the last admission; otherwise the step decodes.
        """
        cfg = self.config
        min_size = 0
        if ws.running and ws.steps_since_admission < cfg.max_waiting_tokens:
            min_size = math.floor(len(ws.running) * cfg.waiting_served_ratio)
        batch = self._tgi_candidates(ws, failed)
        if batch and len(batch) >= min_size:
            for req in batch:
                self._admit(ws, req.num_tokens - req.num_computed_tokens, num_scheduled, new)
            ws.steps_since_admission = 1
            return
        if ws.running:
            self._schedule_running(ws, ws.max_num_batched_tokens, num_scheduled, cached)
            ws.steps_since_admission += 1

    def _tgi_candidates(self, ws: WorkerState, failed: list[Request]) -> list[Request]:
        """The waiting requests (a prefix of the queue) one prefill-only step could take whole."""
        bm = ws.block_manager
        share = self._fair_share(ws)
        free, tokens = bm.num_free_blocks, 0
        picked: list[Request] = []
        for req in list(self.waiting):
            if len(ws.running) + len(picked) >= ws.max_num_seqs or req.num_inflight_steps:
                break
            if not ws.can_host(req):
                if any(w.can_host(req) for w in self.workers.values()):
                    break
                self.waiting.remove(req)
                self._fail(req, "the request needs more KV-cache blocks than any worker has")
                failed.append(req)
                continue
            if len(picked) >= share and self._best_worker(req, prefer=ws) is not ws:
                break
            num_new = req.num_tokens - req.num_computed_tokens
            # No chunking: a prompt over the budget still goes, alone (TGI sizes its budget to fit one).
            if picked and tokens + num_new > ws.max_num_batched_tokens:
                break
            need = bm.num_new_blocks(len(req.block_ids), req.num_computed_tokens + num_new)
            if need > free:
                break
            picked.append(req)
            tokens += num_new
            free -= need
        return picked

    def _admit(
        self, ws: WorkerState, num_new: int, num_scheduled: dict[str, int], new: list[NewRequestData]
    ) -> None:
        """Move the head of the waiting queue onto `ws` with `num_new` tokens to compute this step."""
        req = self.waiting.popleft()
        need = ws.block_manager.num_new_blocks(len(req.block_ids), req.num_computed_tokens + num_new)
        req.block_ids.extend(ws.block_manager.allocate(need))
        req.status = RequestStatus.RUNNING
        req.worker_id = ws.info.worker_id
        req.attempt += 1
        req.num_prefill_tokens = req.num_tokens
        ws.running.append(req)
        new.append(req.to_new_request_data())
        self._count_chunk(req, num_new)
        num_scheduled[req.req_id] = num_new

    def _eligible(self, ws: WorkerState) -> bool:
        return not ws.fenced and len(ws.running) < ws.max_num_seqs

    def _best_worker(self, req: Request, prefer: WorkerState) -> WorkerState | None:
        best: WorkerState | None = None
        for ws in self.workers.values():
            if not self._eligible(ws) or not ws.can_host(req):
                continue
            # Most free blocks wins; on a tie the worker being scheduled now takes it.
            key = (ws.block_manager.num_free_blocks, ws is prefer)
            if best is None or key > (best.block_manager.num_free_blocks, best is prefer):
                best = ws
        return best

    def _fair_share(self, ws: WorkerState) -> int:
        """How many of the waiting requests this worker may take now, by its share of free blocks."""
        total = sum(w.block_manager.num_free_blocks for w in self.workers.values() if self._eligible(w))
        if total == 0:
            return 0
        return math.floor(len(self.waiting) * ws.block_manager.num_free_blocks / total)

    def _count_chunk(self, req: Request, num_new: int) -> None:
        if req.num_computed_tokens + num_new < req.num_tokens_with_placeholders:
            self.stats.num_partial_prefills += 1

    @staticmethod
    def _account_scheduled(req: Request, num_new: int) -> None:
        """Count a step's tokens as computed when it is sent, as vLLM's async scheduler does."""
        req.num_computed_tokens += num_new
        req.num_inflight_steps += 1
        if req.num_computed_tokens == req.num_tokens_with_placeholders:
            req.num_output_placeholders += 1  # this step ends with a sample

    # ----- results -------------------------------------------------------------------------------
    def update_from_output(self, out: ModelRunnerOutput) -> list[Request]:
        """Apply one step's result; returns the requests that finished with it."""
        ws = self.workers.get(out.worker_id)
        if ws is None or not ws.in_flight or ws.in_flight[0][0] != out.step_id:
            return []  # from a worker declared dead, or a duplicate
        _, scheduled = ws.in_flight.popleft()
        self.stats.worker_busy_s += out.step_time
        self.stats.worker_idle_s += out.worker_idle_s
        finished: list[Request] = []
        for req_id in scheduled:
            req = self.requests.get(req_id)
            if req is not None and req.num_inflight_steps:
                req.num_inflight_steps -= 1
        if out.error is not None:
            for req_id in scheduled:
                req = self._running_on(ws, req_id)
                if req is not None:
                    self._fail(req, f"worker step failed: {out.error}")
                    finished.append(req)
            return finished
        for req_id, token_id, reason in zip(
            out.req_ids, out.sampled_token_ids, out.finish_reasons, strict=True
        ):
            req = self.requests.get(req_id)
            if req is None or req_id not in scheduled:
                continue  # aborted or finished while its step ran
            # The token is on the request's stream already, so it is kept even if the request was
            # preempted after this step was sent (it is then recomputed with it).
            req.output_token_ids.append(token_id)
            if req.num_output_placeholders:
                req.num_output_placeholders -= 1
            if reason is not None:
                self._finish(req, reason)
                self.stats.num_finished += 1
                finished.append(req)
        for req_id, message in out.req_errors.items():
            req = self._running_on(ws, req_id)
            if req is not None and self._retry_or_give_up(ws, req, message):
                finished.append(req)
        return finished

    def _retry_or_give_up(self, ws: WorkerState, req: Request, message: str) -> bool:
        """A request failed alone (the worker dropped it): queue it again as a new attempt, or, on its
        `max_deliveries`-th failure, fail it for good and dead-letter it. True when it finished."""
        req.num_failed_deliveries += 1
        if req.num_failed_deliveries >= self.config.max_deliveries:
            self._fail(req, f"{message} (failed on {req.num_failed_deliveries} deliveries)")
            req.dead_letter = True
            self.stats.num_dead_lettered += 1
            return True
        ws.running.remove(req)
        ws.block_manager.free(req.block_ids)
        ws.to_free.append(req.req_id)  # already gone on the worker; freeing twice is harmless there
        self._reset(req)
        self.stats.num_retries += 1
        self.waiting.appendleft(req)
        return False

    # ----- state changes -------------------------------------------------------------------------
    def _running_on(self, ws: WorkerState, req_id: str) -> Request | None:
        req = self.requests.get(req_id)
        if req is None or req.status is not RequestStatus.RUNNING or req.worker_id != ws.info.worker_id:
            return None
        return req

    def _preempt(self, ws: WorkerState, req: Request) -> None:
        ws.running.remove(req)
        ws.block_manager.free(req.block_ids)
        ws.to_free.append(req.req_id)
        self._reset(req)  # num_inflight_steps stays: admission waits for those results
        req.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(req)

    @staticmethod
    def _reset(req: Request) -> None:
        req.status = RequestStatus.WAITING
        req.block_ids = []
        req.num_computed_tokens = 0
        req.num_output_placeholders = 0
        req.worker_id = None

    def _release(self, req: Request) -> None:
        """Give back whatever the request holds: its place in a queue, its blocks, its worker state."""
        if req.status is RequestStatus.RUNNING and req.worker_id is not None:
            ws = self.workers.get(req.worker_id)
            if ws is not None:
                ws.running.remove(req)
                ws.block_manager.free(req.block_ids)
                ws.to_free.append(req.req_id)
        elif req.status is RequestStatus.WAITING and req in self.waiting:
            self.waiting.remove(req)
        req.block_ids = []
        self.requests.pop(req.req_id, None)

    def _finish(self, req: Request, reason: FinishReason) -> None:
        self._release(req)
        self._mark_finished(req, reason)

    def _fail(self, req: Request, message: str) -> None:
        self._release(req)
        self._mark_finished(req, "error")
        req.error = message
        self.stats.num_failed += 1

    @staticmethod
    def _mark_finished(req: Request, reason: FinishReason) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason

    def _expire_early_aborts(self, now: float) -> None:
        stale = [rid for rid, (t, _) in self._early_aborts.items() if now - t > EARLY_ABORT_TTL_S]
        for rid in stale:
            del self._early_aborts[rid]
