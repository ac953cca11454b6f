"""A step is all or nothing: what undoes its diff when it raises, and the rerun one request at a time
that finds the requests which fail alone (ModelRunner.execute_model takes this path on a failure)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from common.protocol import ModelRunnerOutput, SchedulerOutput, WorkerEvent
from gpu_worker.runner.block_table import BlockTable
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.step.launched import FinishedStep


class StepFailed(Exception):
    """A step raised; its diff has been rolled back."""


def undo_log(so: SchedulerOutput, requests: Mapping[str, CachedRequestState]) -> dict[str, int | None]:
    """How to undo the diff: new requests (None) are removed, block tables cut back to a length."""
    undo: dict[str, int | None] = {new.req_id: None for new in so.scheduled_new_reqs}
    for cached in so.scheduled_cached_reqs:
        state = requests.get(cached.req_id)
        if state is not None:
            undo[cached.req_id] = len(state.block_ids)
    return undo


def rollback(
    undo: dict[str, int | None],
    requests: Mapping[str, CachedRequestState],
    block_table: BlockTable,
    drop: Callable[[str], None],
) -> None:
    for req_id, num_blocks in undo.items():
        state = requests.get(req_id)
        if num_blocks is None:
            drop(req_id)
        elif state is not None:
            del state.block_ids[num_blocks:]
            block_table.truncate(req_id, num_blocks)


class IsolatedRunner(Protocol):
    """What the rerun uses of the ModelRunner (named here rather than imported: model_runner.py
    imports this file)."""

    worker_id: str

    def _execute(self, scheduler_output: SchedulerOutput) -> FinishedStep: ...

    def _drop(self, req_id: str) -> None: ...


def isolate(runner: IsolatedRunner, so: SchedulerOutput) -> FinishedStep:
    """Rerun a failed step one request at a time: the ones that fail alone are reported in
    `req_errors` (and dropped here), the others get their token as if the step had not failed.

    Only the failure path pays for this (one forward per request, once); the happy path is one
    forward as before. A failed forward may have written K/V of this step's slots, which the
    rerun overwrites with the same values, so the survivors' tokens are unchanged.
    """
    merged = ModelRunnerOutput(
        step_id=so.step_id,
        worker_id=runner.worker_id,
        epoch=so.epoch,
        req_ids=[],
        sampled_token_ids=[],
        finish_reasons=[],
    )
    frees = so.finished_req_ids
    events: list[WorkerEvent] = []
    for req_id, num_tokens in so.num_scheduled_tokens.items():
        alone = SchedulerOutput(
            step_id=so.step_id,
            scheduled_new_reqs=[n for n in so.scheduled_new_reqs if n.req_id == req_id],
            scheduled_cached_reqs=[c for c in so.scheduled_cached_reqs if c.req_id == req_id],
            num_scheduled_tokens={req_id: num_tokens},
            total_num_scheduled_tokens=num_tokens,
            finished_req_ids=frees,
            scheduled_spec_decode_tokens={
                i: d for i, d in so.scheduled_spec_decode_tokens.items() if i == req_id
            },
            draft_after={i: k for i, k in so.draft_after.items() if i == req_id},
        )
        frees = []  # applied with the first request
        try:
            finished = runner._execute(alone)
        except StepFailed as failed:
            runner._drop(req_id)  # the batcher recomputes it from scratch if it retries
            merged.req_errors[req_id] = str(failed)
            continue
        out = finished.output
        events += finished.events
        merged.req_ids += out.req_ids
        merged.sampled_token_ids += out.sampled_token_ids
        merged.finish_reasons += out.finish_reasons
        merged.req_errors.update(out.req_errors)
        merged.accepted_draft_token_ids.update(out.accepted_draft_token_ids)
        merged.draft_token_ids.update(out.draft_token_ids)
        merged.num_scheduled_tokens += out.num_scheduled_tokens
        merged.num_encoder_runs += out.num_encoder_runs
        merged.num_encoder_cache_hits += out.num_encoder_cache_hits
    return FinishedStep(merged, events)
