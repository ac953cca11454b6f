"""Hand-built steps for tests that drive a ModelRunner or a worker process without a batcher."""

from __future__ import annotations

from common.protocol import CachedRequestData, NewRequestData, SamplingParams, SchedulerOutput


def new_request(
    req_id: str,
    prompt: list[int],
    params: SamplingParams,
    block_ids: list[int],
    *,
    output_token_ids: list[int] | None = None,
    attempt: int = 0,
    num_computed_tokens: int = 0,
) -> NewRequestData:
    """A request sent to the worker for the first time (by default nothing of it computed yet)."""
    return NewRequestData(
        req_id=req_id,
        prompt_token_ids=prompt,
        output_token_ids=output_token_ids or [],
        sampling_params=params,
        block_ids=block_ids,
        num_computed_tokens=num_computed_tokens,
        attempt=attempt,
    )


def scheduler_output(
    step_id: int,
    new_reqs: list[NewRequestData],
    cached_reqs: list[CachedRequestData],
    num_tokens: dict[str, int],
    finished_req_ids: list[str] | None = None,
) -> SchedulerOutput:
    """A step that computes `num_tokens[req_id]` tokens of each request, new or cached."""
    return SchedulerOutput(
        step_id=step_id,
        scheduled_new_reqs=new_reqs,
        scheduled_cached_reqs=cached_reqs,
        num_scheduled_tokens=num_tokens,
        total_num_scheduled_tokens=sum(num_tokens.values()),
        finished_req_ids=finished_req_ids or [],
    )


def prefill_step(new_reqs: list[NewRequestData], step_id: int = 0) -> SchedulerOutput:
    """A step that brings `new_reqs` and computes all their known tokens."""
    num = {n.req_id: len(n.prompt_token_ids) + len(n.output_token_ids) for n in new_reqs}
    return scheduler_output(step_id, new_reqs, [], num)
