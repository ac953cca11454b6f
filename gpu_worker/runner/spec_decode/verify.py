"""Verifying a step's drafts (the batcher proposes them; batcher/core/spec_decode/).

N-gram drafts are point masses, for which rejection sampling is: accept draft x with probability
p(x), else draw from p without x, renormalised. Drawing y from p and accepting x when y == x does
exactly that (on a mismatch y is distributed as p restricted to the other tokens), so each position
is sampled as plain decoding samples it (`Sampler.sample_drafts`: the same uniform per (seed, output
index)), and drafts are accepted while they equal those samples. Greedy is the argmax case; the run
ends with the first sample that differs from its draft, or the bonus token after the last draft.
Every token of the run is the one decoding without drafts gives (for a seeded request, exactly).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from gpu_worker.runner.input_batch import InputBatch
from gpu_worker.runner.sample.logprobs import SampleLogprobs
from gpu_worker.runner.sample.sampler import Sampler, SamplerOutput
from gpu_worker.runner.sample.sampling_state import SamplingState
from gpu_worker.runner.structured_output.matchers import GrammarMask


def sample_drafts(
    sampler: Sampler,
    state: SamplingState,
    batch: InputBatch,
    draft_logits: torch.Tensor,
    grammar: GrammarMask | None,
) -> SamplerOutput:
    """What the model samples at each draft's position, drafts of every request in order."""
    req_ids = [r.state.req_id for r in batch.spec_reqs for _ in r.spec_token_ids]
    earlier = [r.spec_token_ids[:n] for r in batch.spec_reqs for n in range(len(r.spec_token_ids))]
    return sampler.sample_drafts(draft_logits, state, req_ids, earlier, grammar)


def accept_drafts(
    drafts: Sequence[list[int]], samples: Sequence[int], bonus_token_ids: Sequence[int]
) -> list[list[int]]:
    """Per request, the tokens the step outputs (1..k+1): accepted drafts, then one the model chose.

    `samples`: per draft of every request in order, what the model samples at its position;
    `bonus_token_ids`: per request, the token sampled after its last draft."""
    runs: list[list[int]] = []
    start = 0
    for proposed, bonus in zip(drafts, bonus_token_ids, strict=True):
        chosen = samples[start : start + len(proposed)]
        start += len(proposed)
        num_accepted = 0
        while num_accepted < len(proposed) and chosen[num_accepted] == proposed[num_accepted]:
            num_accepted += 1
        last = bonus if num_accepted == len(proposed) else chosen[num_accepted]
        runs.append([*proposed[:num_accepted], last])
    return runs


def verify_drafts(
    batch: InputBatch,
    draft_samples: list[int],
    sampled: list[int],
    state: SamplingState,
    accepted: dict[str, list[int]],
) -> list[int]:
    """The step's tokens with each drafting request's replaced by the last of its verified run;
    the drafts it accepted kept in `accepted`."""
    if not batch.spec_reqs:
        return sampled
    tokens = list(sampled)
    row = {r.state.req_id: i for i, r in enumerate(batch.sampling_reqs)}
    spec_ids = [r.state.req_id for r in batch.spec_reqs]
    drafts = [r.spec_token_ids for r in batch.spec_reqs]
    runs = accept_drafts(drafts, draft_samples, [tokens[row[i]] for i in spec_ids])
    for req_id, run in zip(spec_ids, runs, strict=True):
        state.count_run(req_id, run[:-1], tokens[row[req_id]], run[-1])
        tokens[row[req_id]] = run[-1]
        accepted[req_id] = run[:-1]
    return tokens


def run_logprobs(
    batch: InputBatch,
    accepted: Mapping[str, list[int]],
    sampled: Sequence[SampleLogprobs | None],
    drafted: Sequence[SampleLogprobs | None],
) -> dict[str, list[SampleLogprobs]]:
    """Per request that asks for logprobs, those of each token of its run: an accepted draft's and
    a sample that replaced a rejected draft come from that draft's row (its sample is the token),
    the token after a run accepted whole from the request's sampling row. `sampled` per sampling
    row, `drafted` per draft row (`batch.spec_reqs`' drafts in order); `accepted`: the drafts each
    drafting request accepted."""
    first_row: dict[str, int] = {}
    num_drafts: dict[str, int] = {}
    row = 0
    for req in batch.spec_reqs:
        first_row[req.state.req_id] = row
        num_drafts[req.state.req_id] = len(req.spec_token_ids)
        row += len(req.spec_token_ids)
    runs: dict[str, list[SampleLogprobs]] = {}
    for req, last in zip(batch.sampling_reqs, sampled, strict=True):
        req_id = req.state.req_id
        if last is None:
            continue
        start, k = first_row.get(req_id, 0), num_drafts.get(req_id, 0)
        n = len(accepted.get(req_id, []))
        # The accepted drafts' rows, and the rejected draft's row when there is one.
        records = drafted[start : start + min(n + 1, k)]
        assert all(r is not None for r in records), "a request's draft rows carry its logprobs"
        runs[req_id] = [r for r in records if r is not None] + ([last] if n == k else [])
    return runs
