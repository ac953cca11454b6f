"""Iteration-level scheduling (Orca-style continuous batching) for any number of workers. No I/O.

`Scheduler` is the entry point the batcher drives; each decision lives in a module of its own:

- placement.py: which worker a waiting request goes to;
- step_scheduler.py and policies/ (fused.py, tgi.py, behind interface.py): what runs in one
  worker's step (token budget, running before waiting, chunked prefill);
- preemption.py: when a running request is preempted, and which one;
- retry_rules.py: when a request is retried, dead-lettered, expired, or aborted before it arrived;
- kv/: each worker's KV blocks (kv_cache_manager.py), the pool and the prefix cache beneath it;
- scheduler_state.py: what they all read and change (workers, requests, the waiting queue).
"""

from __future__ import annotations

from batcher.core.request import Request, RequestStatus
from batcher.core.retry_rules import EarlyAborts, expire_waiting, retry_or_give_up
from batcher.core.scheduler_state import (
    SchedulerConfig,
    SchedulerState,
    SchedulerStats,
    SchedulingPolicyName,
    reset,
)
from batcher.core.spec_decode.auto_off import make_auto_off
from batcher.core.spec_decode.drafting import adapt_num_spec_tokens
from batcher.core.step_scheduler import make_policy, schedule_step
from batcher.core.worker_state import WorkerState
from common.protocol import ModelRunnerOutput, SchedulerOutput, WorkerInfo

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerStats", "SchedulingPolicyName", "WorkerState"]


class Scheduler(SchedulerState):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.policy = make_policy(config)
        self.early_aborts = EarlyAborts()
        # vLLM's per-position acceptance: entry i counts drafts accepted at position i of their step.
        self.spec_accepted_per_pos: list[int] = []

    # ----- workers -------------------------------------------------------------------------------
    def add_worker(self, info: WorkerInfo) -> list[Request]:
        """Register a worker; one rejoining under its id after a restart holds none of the KV the
        old process held, so the old one is removed first (its requests, returned, wait again)."""
        known = self.workers.get(info.worker_id)
        if known is not None and known.info.started_at == info.started_at:
            return []
        orphans = self.remove_worker(info.worker_id) if known is not None else []
        cfg = self.config
        ws = WorkerState.register(
            info, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.enable_prefix_caching
        )
        ws.auto_off = make_auto_off(cfg.speculative)
        self.workers[info.worker_id] = ws
        return orphans

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
            reset(req)
            req.num_inflight_steps = 0
            self.waiting.appendleft(req)
        self.stats.num_failovers += len(orphans)
        return orphans

    # ----- requests ------------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> list[Request]:
        """Queue a request; returns it already finished when an abort for it came first."""
        self.early_aborts.expire(now)
        if req.req_id in self.requests:
            return []  # delivered twice (e.g. re-read after a restart): keep the one we have
        if self.early_aborts.apply(req):
            self.stats.num_aborted += 1
            return [req]
        req.queued_at = now
        self.requests[req.req_id] = req
        self.waiting.append(req)
        return []

    def abort_request(self, req_id: str, reason: str, now: float) -> Request | None:
        req = self.requests.get(req_id)
        if req is None:
            self.early_aborts.remember(req_id, reason, now)
            return None
        self.finish(req, "stop" if reason == "stop" else "abort")
        self.stats.num_aborted += 1
        return req

    def expire_waiting(self, now: float) -> list[Request]:
        """Fail the never-scheduled requests waiting past their queue deadline (retry_rules.py)."""
        return expire_waiting(self, now)

    @property
    def num_running(self) -> int:
        return sum(len(ws.running) for ws in self.workers.values())

    # ----- one step ------------------------------------------------------------------------------
    def schedule(self, worker_id: str) -> tuple[SchedulerOutput | None, list[Request]]:
        """The next step for `worker_id` (None when it has nothing to compute) and requests failed now."""
        return schedule_step(self, self.policy, self.workers[worker_id])

    # ----- results -------------------------------------------------------------------------------
    def update_from_output(self, out: ModelRunnerOutput) -> list[Request]:
        """Apply one step's result; returns the requests that finished with it."""
        ws = self.workers.get(out.worker_id)
        if ws is None or not ws.in_flight or ws.in_flight[0][0] != out.step_id:
            return []  # from a worker declared dead, or a duplicate
        _, scheduled = ws.in_flight.popleft()
        self.stats.worker_busy_s += out.step_time
        self.stats.worker_idle_s += out.worker_idle_s
        self.stats.num_steps_overlapped += out.overlapped
        ws.num_encoder_runs += out.num_encoder_runs
        ws.num_encoder_cache_hits += out.num_encoder_cache_hits
        finished: list[Request] = []
        for req_id in scheduled:
            req = self.requests.get(req_id)
            if req is not None and req.num_inflight_steps:
                req.num_inflight_steps -= 1
        for req_id, token_id, reason in zip(
            out.req_ids, out.sampled_token_ids, out.finish_reasons, strict=True
        ):
            req = self.requests.get(req_id)
            if req is None or req_id not in scheduled:
                continue  # aborted or finished while its step ran
            # The token is on the request's stream already, so it is kept even if the request was
            # preempted after this step was sent (it is then recomputed with it).
            accepted = out.accepted_draft_token_ids.get(req_id, [])
            self.account_drafts(ws, req, len(accepted))
            req.output_token_ids += accepted
            req.output_token_ids.append(token_id)
            if req.num_output_placeholders:
                req.num_output_placeholders -= 1
            if reason is not None:
                self.finish(req, reason)
                self.stats.num_finished += 1
                finished.append(req)
        for req_id in scheduled:
            req = self.requests.get(req_id)
            if req is not None:
                req.spec_token_ids = []  # a request that did not sample (failed, skipped) drafted nothing
                req.draft_token_ids = out.draft_token_ids.get(req_id, [])
        for req_id, message in out.req_errors.items():
            req = self.running_on(ws, req_id)
            if req is not None and retry_or_give_up(self, ws, req, message):
                finished.append(req)
        return finished

    def account_drafts(self, ws: WorkerState, req: Request, num_accepted: int) -> None:
        """The accepted drafts' KV is computed: count it (the rejected ones' is not, and is rewritten)."""
        num_drafts = len(req.spec_token_ids)
        if not num_drafts:
            return
        if req.status is RequestStatus.RUNNING:
            req.num_computed_tokens += num_accepted
        if self.config.speculative is not None:
            adapt_num_spec_tokens(self.config.speculative, req, num_accepted)
        if ws.auto_off is not None:
            ws.auto_off.record(num_drafts, num_accepted)
        self.stats.spec_decode_num_drafts += 1
        self.stats.spec_decode_num_draft_tokens += num_drafts
        self.stats.spec_decode_num_accepted_tokens += num_accepted
        per_pos = self.spec_accepted_per_pos
        per_pos.extend([0] * (num_drafts - len(per_pos)))
        for pos in range(num_accepted):
            per_pos[pos] += 1
