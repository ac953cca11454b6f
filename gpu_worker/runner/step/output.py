"""What a step's samples become: each request advanced by its token, and the token-stream events."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from common.finish import check_finish
from common.protocol import FinishReason, ModelRunnerOutput, PromptEvent, TokenEvent
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.input_batch import InputBatch, ScheduledRequest
from gpu_worker.runner.sample.logprobs import SampleLogprobs
from gpu_worker.runner.step.launched import PLACEHOLDER


def reserve(batch: InputBatch) -> list[int]:
    """Count the step's tokens as computed and append a placeholder for each sampling request's
    token; returns where each placeholder is, for `advance` (vLLM's async scheduling does the same)."""
    for req in batch.scheduled:
        # Drafts count once accepted: a rejected one's slot is rewritten by the next step.
        req.state.num_computed_tokens += req.num_tokens - len(req.spec_token_ids)
    indexes: list[int] = []
    for req in batch.sampling_reqs:
        indexes.append(req.state.num_tokens)
        req.state.token_ids.append(PLACEHOLDER)
    return indexes


def advance(
    reqs: Sequence[ScheduledRequest],
    indexes: Sequence[int],
    runs: list[list[int]],
    eos_token_ids: Collection[int],
    max_model_len: int,
    grammar_ends: Mapping[str, FinishReason] | None = None,
) -> list[FinishReason | None]:
    """Put each request's run in place of its placeholder (`indexes`, from `reserve`) and decide
    whether it finishes; `runs`: per request its tokens (the sample, after any accepted drafts), cut
    in place after a token that ends the request; `grammar_ends`: requests their grammar ends
    (see StructuredOutputs.accept). Later steps' placeholders, if any, stay where they are."""
    reasons: list[FinishReason | None] = []
    for req, index, run in zip(reqs, indexes, runs, strict=True):
        state = req.state
        state.num_computed_tokens += len(run) - 1
        reason: FinishReason | None = None
        for i, token_id in enumerate(run):
            position = index + i
            reason = check_finish(
                token_id,
                position + 1 - state.num_prompt_tokens,
                position + 1,
                state.sampling_params,
                eos_token_ids,
                max_model_len,
            )
            if reason is not None:
                del run[i + 1 :]  # EOS, a stop id or max_tokens inside an accepted run ends it there
                break
        state.token_ids[index : index + 1] = run
        state.finish_reason = reason
        if grammar_ends and state.req_id in grammar_ends:
            # A broken grammar outranks any reason; a terminated one only ends what goes on.
            ended = grammar_ends[state.req_id]
            if ended == "error" or state.finish_reason is None:
                state.finish_reason = ended
        reasons.append(state.finish_reason)
    return reasons


def token_events(
    output: ModelRunnerOutput,
    requests: Mapping[str, CachedRequestState],
    logprobs: Mapping[str, list[SampleLogprobs]],
    firsts: Mapping[str, int],
) -> list[TokenEvent | PromptEvent]:
    """The step's events: per request its accepted drafts, then its sample, one event each, with
    `logprobs[req_id][i]` for the run's i-th token where the request asks for them; `firsts`: the
    output index of each run's first token."""
    events: list[TokenEvent | PromptEvent] = []
    for req_id, token_id, reason in zip(
        output.req_ids, output.sampled_token_ids, output.finish_reasons, strict=True
    ):
        state = requests[req_id]
        accepted = output.accepted_draft_token_ids.get(req_id, [])
        first = firsts[req_id]
        num_cached_tokens = state.num_cached_tokens if first == 0 else 0
        generates = state.sampling_params.max_tokens > 0
        if first == 0 and (state.prompt_logprobs is not None or not generates):
            events.append(prompt_event(state, None if generates else reason, num_cached_tokens))
        if not generates:
            continue  # its one sample only ended the prompt: never shown, never counted
        records = logprobs.get(req_id)
        for offset, run_token in enumerate([*accepted, token_id]):
            last = offset == len(accepted)
            sample = None if records is None else records[offset]
            events.append(
                TokenEvent(
                    req_id=req_id,
                    index=first + offset,
                    token_id=run_token,
                    attempt=state.attempt,
                    finish_reason=reason if last else None,
                    logprob=None if sample is None else sample.logprob,
                    top_token_ids=[] if sample is None else sample.top_token_ids,
                    top_logprobs=[] if sample is None else sample.top_logprobs,
                    num_cached_tokens=num_cached_tokens if offset == 0 else 0,
                )
            )
    return events


def prompt_event(
    state: CachedRequestState, finish_reason: FinishReason | None, num_cached_tokens: int
) -> PromptEvent:
    collected = state.prompt_logprobs
    return PromptEvent(
        req_id=state.req_id,
        attempt=state.attempt,
        token_ids=state.token_ids[: state.num_prompt_tokens],
        logprobs=[] if collected is None else collected.logprobs,
        top_token_ids=[] if collected is None else collected.top_token_ids,
        top_logprobs=[] if collected is None else collected.top_logprobs,
        finish_reason=finish_reason,
        num_cached_tokens=num_cached_tokens if finish_reason is not None else 0,
    )
