"""One worker's next step: what runs in it, as a `SchedulerOutput`. No I/O.

Less urgent running requests first make room for a waiting request nobody else can take
(preemption.py); then the policy chosen by `make_policy` fills the step (policies/fused.py or
policies/tgi.py), and its tokens count as computed as soon as it is sent, as in vLLM's async scheduler.
"""

from __future__ import annotations

from batcher.core.policies.fused import FusedPolicy
from batcher.core.policies.interface import SchedulingPolicy, StepDraft
from batcher.core.policies.tgi import TGIPolicy
from batcher.core.preemption import preempt_for_waiting
from batcher.core.request import Request
from batcher.core.scheduler_state import SchedulerConfig, SchedulerState
from batcher.core.worker_state import WorkerState
from common.protocol import SchedulerOutput


def make_policy(config: SchedulerConfig) -> SchedulingPolicy:
    """The policy `config.scheduling_policy` names."""
    if config.scheduling_policy == "tgi":
        return TGIPolicy(config.waiting_served_ratio, config.max_waiting_tokens)
    return FusedPolicy()


def schedule_step(
    state: SchedulerState, policy: SchedulingPolicy, ws: WorkerState
) -> tuple[SchedulerOutput | None, list[Request]]:
    """The next step for `ws` (None when it has nothing to compute) and requests failed now."""
    if ws.fenced:
        return None, []
    assert len(ws.in_flight) < state.config.max_steps_in_flight, "too many steps in flight"
    step = StepDraft(encoder_budget=state.config.max_num_encoder_input_tokens or ws.max_num_batched_tokens)
    preempt_for_waiting(state, ws)
    policy.schedule(state, ws, step)

    num_scheduled = step.num_scheduled
    if not num_scheduled:
        return None, step.failed
    ws.step_id += 1
    ws.in_flight.append((ws.step_id, dict(num_scheduled)))
    for req_id, n in num_scheduled.items():
        account_scheduled(state.requests[req_id], n, step.spec_token_ids.get(req_id, []))
    state.stats.num_steps += 1
    out = SchedulerOutput(
        step_id=ws.step_id,
        scheduled_new_reqs=step.new,
        scheduled_cached_reqs=step.cached,
        num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=sum(num_scheduled.values()),
        finished_req_ids=ws.to_free,
        scheduled_spec_decode_tokens=step.spec_token_ids,
        draft_after=step.draft_after,
    )
    ws.to_free = []
    return out, step.failed


def account_scheduled(req: Request, num_new: int, drafts: list[int]) -> None:
    """Count a step's tokens as computed when it is sent, as vLLM's async scheduler does; its drafts
    only once the result says which were accepted (the rejected ones' slots are simply rewritten)."""
    req.num_computed_tokens += num_new - len(drafts)
    req.spec_token_ids = drafts
    req.num_inflight_steps += 1
    if req.num_computed_tokens == req.num_tokens_with_placeholders:
        req.num_output_placeholders += 1  # this step ends with a sample
