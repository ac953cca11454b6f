"""The step's sampling after its forward: grammar masks, samples, drafts verified, grammars advanced
(the generating runner's; the pooling runner pools instead: pooling/causal_runner.py).

A step whose rows need no host decision (no drafts to verify, no grammar) is left on the device:
its tokens feed the next step there, and the host reads them when it finishes the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.protocol import FinishReason
from gpu_worker.runner.input_batch import InputBatch
from gpu_worker.runner.sample.logprobs import SampleLogprobs
from gpu_worker.runner.sample.sampler import PendingSample, Sampler
from gpu_worker.runner.sample.sampling_state import SamplingState
from gpu_worker.runner.spec_decode.verify import run_logprobs, sample_drafts, verify_drafts
from gpu_worker.runner.structured_output.matchers import StructuredOutputs


@dataclass(frozen=True, slots=True)
class SampledStep:
    token_ids: list[int]  # per request that samples, the last token of its run
    accepted: dict[str, list[int]]  # the drafts each drafting request accepted
    logprobs: dict[str, list[SampleLogprobs]]  # per token of each run, of the requests that asked
    grammar_ends: dict[str, FinishReason]  # what the step's grammars ended, by req_id


@dataclass(frozen=True, slots=True)
class LaunchedSample:
    """A step's samples as launched: on the device (`token_ids`, `done`) or read already."""

    token_ids: torch.Tensor | None  # [N] on the device while the host has not read them; else None
    done: Callable[[], bool]  # whether reading them would not wait
    wait: Callable[[], None]  # until reading them would not wait (any thread)
    result: Callable[[], SampledStep]  # waits for them, once

    @classmethod
    def read(cls, step: SampledStep) -> LaunchedSample:
        return cls(None, lambda: True, lambda: None, lambda: step)

    @classmethod
    def pending(cls, batch: InputBatch, sample: PendingSample) -> LaunchedSample:
        def result() -> SampledStep:
            out = sample.output()
            return SampledStep(out.token_ids, {}, run_logprobs(batch, {}, out.logprobs, []), {})

        return cls(sample.token_ids, sample.host.done, sample.host.wait_ready, result)


def launch_sample_step(
    batch: InputBatch,
    kept: torch.Tensor,
    sampler: Sampler,
    sampling_state: SamplingState,
    structured_outputs: StructuredOutputs,
) -> LaunchedSample:
    """`sample_step`, left on the device where no row needs the host: no drafts, no grammar."""
    req_ids = [r.state.req_id for r in batch.sampling_reqs]
    if batch.spec_reqs or structured_outputs.constrains(req_ids):
        return LaunchedSample.read(sample_step(batch, kept, sampler, sampling_state, structured_outputs))
    logits = kept[: len(req_ids)]
    return LaunchedSample.pending(batch, sampler.launch(logits, sampling_state, req_ids))


def sample_step(
    batch: InputBatch,
    kept: torch.Tensor,
    sampler: Sampler,
    sampling_state: SamplingState,
    structured_outputs: StructuredOutputs,
) -> SampledStep:
    """Grammar masks and sampling of a non-empty batch from its forward's `kept` logits."""
    num_sampling = len(batch.sampling_reqs)
    logits = kept[:num_sampling]
    req_ids = [r.state.req_id for r in batch.sampling_reqs]
    spec = [(r.state.req_id, r.spec_token_ids) for r in batch.spec_reqs]
    grammar, draft_grammar = structured_outputs.masks(req_ids, spec)
    # Before the step's own samples (`Sampler.launch`), which record its tokens in the sampling state.
    drafted = sample_drafts(sampler, sampling_state, batch, kept[num_sampling:], draft_grammar)
    # A drafting request's sampling row comes after its drafts.
    earlier = [r.spec_token_ids for r in batch.sampling_reqs] if batch.spec_reqs else None
    result = sampler.launch(logits, sampling_state, req_ids, grammar, earlier).output()
    accepted: dict[str, list[int]] = {}
    tokens = verify_drafts(batch, drafted.token_ids, result.token_ids, sampling_state, accepted)
    logprobs = run_logprobs(batch, accepted, result.logprobs, drafted.logprobs)
    runs = [[*accepted.get(i, []), t] for i, t in zip(req_ids, tokens, strict=True)]
    grammar_ends = structured_outputs.accept(req_ids, runs)
    for req_id in grammar_ends:  # its run may end at a stop token among its drafts
        i = req_ids.index(req_id)
        tokens[i] = runs[i][-1]
        if req_id in accepted:
            accepted[req_id] = runs[i][:-1]
    return SampledStep(tokens, accepted, logprobs, grammar_ends)
