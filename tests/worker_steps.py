"""Hand-built steps for tests that drive a ModelRunner or a worker process without a batcher."""

from __future__ import annotations

from common.protocol import NewRequestData, SamplingParams, SchedulerOutput


def new_request(
    req_id: str,
    prompt: list[int],
    params: SamplingParams,
    block_ids: list[int],
    *,
    output_token_ids: list[int] | None = None,
    attempt: int = 0,
) -> NewRequestData:
    """A request sent to the worker for the first time, nothing of it computed yet."""
    return NewRequestData(
        req_id=req_id,
        prompt_token_ids=prompt,
        output_token_ids=output_token_ids or [],
        sampling_params=params,
        block_ids=block_ids,
        num_computed_tokens=0,
        attempt=attempt,
    )


def prefill_step(new_reqs: list[NewRequestData], step_id: int = 0) -> SchedulerOutput:
    """A step that brings `new_reqs` and computes all their known tokens."""
    num = {n.req_id: len(n.prompt_token_ids) + len(n.output_token_ids) for n in new_reqs}
    return SchedulerOutput(
        step_id=step_id,
        scheduled_new_reqs=new_reqs,
        scheduled_cached_reqs=[],
        num_scheduled_tokens=num,
        total_num_scheduled_tokens=sum(num.values()),
        finished_req_ids=[],
    )
