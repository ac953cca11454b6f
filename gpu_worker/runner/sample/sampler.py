"""Next-token sampling on the device: greedy, temperature, min-p, top-k and top-p, one row per request.

Rows come from `SamplingState` (parameters kept on the device between steps). Before sampling,
rows that ask for them get logit_bias, their grammar's mask
(`gpu_worker/runner/structured_output/matchers.py`), the min_tokens mask and penalties
(`logits_processors.py`); rows that ask for logprobs get them from the raw logits (`logprobs.py`), as
with logit_bias: what the model predicted. Greedy is a bare argmax.

A random row draws one uniform number and picks its token by inverse CDF, in float32. Filters work
only on the rows that set them, in vLLM v1's order: min-p (tokens at least min_p x the top
probability), then top-k, then top-p over what remains. Rows with temperature alone (or min-p) need
no sort, top-k rows use topk, and only top-p rows sort the vocabulary.

A seeded request's uniform is a hash of (seed, output index) (`seeded_uniform.py`), so its token
depends only on its own logits and that pair: never on the other requests in the batch, nor on
preemption and resume (which recompute the same logits). Others share one device generator.
The sampled tokens, and logprobs when a row asked, come back to the host in one transfer: on CUDA
into pinned memory on a side stream behind an event, which the host waits on only when it reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from gpu_worker.runner.host_copies import DeviceToHost, HostValues
from gpu_worker.runner.sample.logits_processors import (
    apply_logit_bias,
    apply_min_tokens,
    apply_penalties,
    restore_emptied_rows,
)
from gpu_worker.runner.sample.logprobs import SampleLogprobs, compute_logprobs, to_sample_logprobs
from gpu_worker.runner.sample.sampling_state import (
    GREEDY,
    MIN_P,
    MIN_TOKENS,
    OUTPUT_INDEX,
    PLAIN,
    PRESENCE,
    REPETITION,
    SEED,
    SEEDED,
    TEMPERATURE,
    TOP_K,
    TOP_K_PATH,
    TOP_P,
    SamplingBatch,
    SamplingState,
)
from gpu_worker.runner.sample.seeded_uniform import seeded_uniforms
from gpu_worker.runner.structured_output.matchers import GrammarMask


@dataclass(slots=True, frozen=True)
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[SampleLogprobs | None]  # one per row, None where the request did not ask


@dataclass(slots=True, frozen=True)
class PendingSample:
    """A step's samples: `token_ids` [N] on the device now, their `output()` once on the host."""

    token_ids: torch.Tensor
    host: HostValues
    output: Callable[[], SamplerOutput]


class Sampler:
    """Turns logits into token ids; owns the generator used by requests without a seed."""

    def __init__(self, seed: int | None = None, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._generator = torch.Generator(device=self.device)
        self._copies = DeviceToHost(self.device)  # sampled ids to pinned memory on a side stream
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)

    def launch(
        self,
        logits: torch.Tensor,
        state: SamplingState,
        req_ids: Sequence[str],
        grammar: GrammarMask | None = None,
        earlier: Sequence[Sequence[int]] | None = None,
    ) -> PendingSample:
        """logits [N, V], row i for `req_ids[i]` (each added to `state`); `grammar`: the masks of the
        constrained rows; `earlier`: per row, the tokens it follows within the step (a drafting
        request's drafts, taken as output: its output index and penalty counts). Records the sampled
        tokens in `state` (output index, penalty counts). Returns at once: the tokens are on the
        device, on their way to the host (`output()` waits for them)."""
        if not req_ids:
            nothing = torch.zeros(0, dtype=torch.long, device=self.device)
            return PendingSample(nothing, HostValues(nothing, None), lambda: SamplerOutput([], []))
        batch = state.prepare(req_ids)
        if earlier is not None:
            _take_as_output(batch, earlier)
        tokens = self._pick(self._processed(logits, batch, grammar), batch)
        host = self._start_to_host(logits, tokens, batch)
        state.record(batch, tokens)  # queued while the tokens travel
        return PendingSample(tokens, host, partial(self._output, host, batch))

    def sample_drafts(
        self,
        logits: torch.Tensor,
        state: SamplingState,
        req_ids: Sequence[str],
        earlier: Sequence[Sequence[int]],
        grammar: GrammarMask | None = None,
    ) -> SamplerOutput:
        """What plain decoding would sample at each draft's position, `earlier[i]` the drafts before
        row i's: the same logit_bias, min_tokens and penalties with those drafts taken as output,
        the grammar's state after them, and the same uniform per (seed, output index), so a seeded
        request's tokens do not depend on the drafts; with the logprobs of each row's sample where
        its request asks for them. Records nothing."""
        if not req_ids:
            return SamplerOutput([], [])
        batch = state.prepare(req_ids)
        _take_as_output(batch, earlier)
        tokens = self._pick(self._processed(logits, batch, grammar), batch)
        return self._output(self._start_to_host(logits, tokens, batch), batch)

    def _processed(
        self, logits: torch.Tensor, batch: SamplingBatch, grammar: GrammarMask | None
    ) -> torch.Tensor:
        """`logits` with bias, min_tokens, penalties and the grammar applied, in a float32 copy so
        that the raw logits stay intact for logprobs; `logits` itself where nothing applies."""
        if batch.any_bias or batch.any_min_tokens or batch.penalty_rows is not None or grammar is not None:
            logits = logits.to(torch.float32, copy=True)
            self._process(logits, batch, grammar)
        return logits

    def _process(self, logits: torch.Tensor, batch: SamplingBatch, grammar: GrammarMask | None) -> None:
        if batch.bias_ids is not None and batch.bias_values is not None:
            apply_logit_bias(logits, batch.bias_ids, batch.bias_values)
        if grammar is not None:
            grammar.apply(logits)
        if batch.stop_ids is not None:
            # A grammar that allows only stop tokens (its output is complete) outranks min_tokens.
            rows = None if grammar is None else torch.tensor(grammar.rows, device=logits.device)
            allowed = None if rows is None else logits.index_select(0, rows)
            apply_min_tokens(logits, batch.stop_ids, batch.ints[:, OUTPUT_INDEX], batch.ints[:, MIN_TOKENS])
            if rows is not None and allowed is not None:
                restore_emptied_rows(logits, rows, allowed)
        if batch.penalty_rows is not None:
            assert batch.prompt_mask is not None and batch.output_counts is not None
            penalties = batch.floats.index_select(0, batch.penalty_rows)[:, REPETITION : PRESENCE + 1]
            apply_penalties(logits, batch.penalty_rows, batch.prompt_mask, batch.output_counts, penalties)

    def _pick(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        num_rows = batch.num_rows
        uniforms: torch.Tensor | None = None
        if batch.path_sizes[GREEDY] < num_rows:
            uniforms = self._uniforms(batch)
        tokens = torch.empty(num_rows, dtype=torch.long, device=logits.device)
        for path, size in enumerate(batch.path_sizes):
            if size == 0:
                continue
            rows = batch.path_rows[path]
            sub, floats, ints = logits, batch.floats, batch.ints
            if rows is not None:
                sub, floats, ints = (
                    sub.index_select(0, rows),
                    floats.index_select(0, rows),
                    ints.index_select(0, rows),
                )
            if path == GREEDY:
                # max's indices are argmax's (the first of tied maxima, NaN first) at a third of its
                # time on the CPU, where argmax over a 32k vocabulary is a visible share of a step.
                picked = sub.max(dim=-1).indices
            else:
                assert uniforms is not None
                u = uniforms if rows is None else uniforms.index_select(0, rows)
                scaled = sub.float() / floats[:, TEMPERATURE : TEMPERATURE + 1]
                if path == PLAIN:
                    picked = sample_plain(scaled, u, floats[:, MIN_P] if batch.plain_min_p else None)
                elif path == TOP_K_PATH:
                    picked = sample_top_k(scaled, u, ints[:, TOP_K], batch.max_top_k, floats[:, MIN_P])
                else:
                    picked = sample_top_p(scaled, u, floats[:, TOP_P], ints[:, TOP_K], floats[:, MIN_P])
            if rows is None:
                tokens = picked
            else:
                tokens.index_copy_(0, rows, picked)
        return tokens

    def _uniforms(self, batch: SamplingBatch) -> torch.Tensor:
        ints = batch.ints
        drawn = torch.rand(batch.num_rows, generator=self._generator, device=self.device)
        seeded = seeded_uniforms(ints[:, SEED], ints[:, OUTPUT_INDEX])
        return torch.where(ints[:, SEEDED].bool(), seeded, drawn)

    def _start_to_host(
        self, raw_logits: torch.Tensor, tokens: torch.Tensor, batch: SamplingBatch
    ) -> HostValues:
        """The tokens, then the logprobs of the rows that asked, on their way to the host in one
        copy (pinned, behind an event: host_copies.py); the host waits only in `_output`."""
        rows, ks = batch.logprob_rows, batch.logprob_ks
        if rows is None:
            return self._copies.start(tokens)
        chosen, top_values, top_ids = compute_logprobs(raw_logits, rows, tokens, max(ks))
        # float32 bits travel as int64 so that everything comes back in one copy.
        return self._copies.start(
            torch.cat([tokens, _bits(chosen), top_ids.flatten(), _bits(top_values.flatten())])
        )

    def _output(self, host: HostValues, batch: SamplingBatch) -> SamplerOutput:
        num_rows, ks = batch.num_rows, batch.logprob_ks
        if batch.logprob_rows is None:
            return SamplerOutput(host.tolist(), [None] * num_rows)
        max_k, num_logprobs = max(ks), len(ks)
        sizes = [num_rows, num_logprobs, num_logprobs * max_k, num_logprobs * max_k]
        token_part, chosen_part, ids_part, values_part = host.wait().split(sizes)
        records = to_sample_logprobs(
            _floats(chosen_part).tolist(),
            _floats(values_part).view(num_logprobs, max_k).tolist(),
            ids_part.view(num_logprobs, max_k).tolist(),
            ks,
        )
        logprobs: list[SampleLogprobs | None] = [None] * num_rows
        for row, record in zip(batch.logprob_row_list, records, strict=True):
            logprobs[row] = record
        return SamplerOutput(token_part.tolist(), logprobs)


def _take_as_output(batch: SamplingBatch, earlier: Sequence[Sequence[int]]) -> None:
    """Each row as if its `earlier` tokens were output already: its output index further on, and
    its penalty counts with them. The batch holds the step's own copies: the state is untouched."""
    shift = torch.tensor([len(tokens) for tokens in earlier], dtype=batch.ints.dtype)
    batch.ints[:, OUTPUT_INDEX] += shift.to(batch.ints.device)
    if batch.output_counts is None:
        return
    rows = [p for p, row in enumerate(batch.penalty_row_list) for _ in earlier[row]]
    if rows:
        tokens = [t for row in batch.penalty_row_list for t in earlier[row]]
        index = torch.tensor([rows, tokens], device=batch.output_counts.device)
        ones = torch.ones(len(rows), device=batch.output_counts.device)
        batch.output_counts.index_put_((index[0], index[1]), ones, accumulate=True)


def _bits(values: torch.Tensor) -> torch.Tensor:
    return values.float().view(torch.int32).long()


def _floats(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row of unnormalised `probs` [R, K], the index where the CDF passes `uniforms` [R] x total.

    A token with zero probability is never picked: rounding that puts the target at the very top of
    the CDF falls back to the last token that carries mass."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:].contiguous()
    picked = torch.searchsorted(cdf, uniforms.unsqueeze(1) * total, right=True)
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(picked, last).squeeze(1)


def _drop_below_min_p(probs: torch.Tensor, top: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """In place: `probs` is always a fresh softmax here."""
    return probs.masked_fill_(probs < min_p.unsqueeze(1) * top, 0.0)


def sample_plain(
    scaled: torch.Tensor, uniforms: torch.Tensor, min_p: torch.Tensor | None = None
) -> torch.Tensor:
    """Token ids for temperature-scaled logits [R, V], without any sort; min_p [R] when set."""
    probs = scaled.softmax(dim=-1)
    if min_p is not None:
        probs = _drop_below_min_p(probs, probs.amax(dim=-1, keepdim=True), min_p)
    return inverse_cdf(probs, uniforms)


def sample_top_k(
    scaled: torch.Tensor,
    uniforms: torch.Tensor,
    top_k: torch.Tensor,
    max_top_k: int,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token ids among each row's `top_k` [R] most likely, through one topk of `max_top_k` (the
    largest of `top_k`, known on the host)."""
    values, ids = scaled.topk(max_top_k, dim=-1)
    ranks = torch.arange(max_top_k, device=scaled.device)
    probs = values.masked_fill_(ranks >= top_k.unsqueeze(1), float("-inf")).softmax(dim=-1)
    if min_p is not None:
        probs = _drop_below_min_p(probs, probs[:, :1], min_p)
    return ids.gather(1, inverse_cdf(probs, uniforms).unsqueeze(1)).squeeze(1)


def sample_top_p(
    scaled: torch.Tensor,
    uniforms: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Token ids after min-p and top-k ([R] each; top_k = V keeps all), then top-p [R] over the mass
    that remains: one full sort per row."""
    sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1)
    ranks = torch.arange(probs.shape[-1], device=scaled.device).unsqueeze(0)
    probs = _drop_below_min_p(probs, probs[:, :1], min_p).masked_fill_(ranks >= top_k.unsqueeze(1), 0.0)
    cdf = probs.cumsum(dim=-1)
    mass_before = cdf - probs
    # Keep a token while the mass before it is under top_p; the most likely one always stays.
    outside = (mass_before >= top_p.unsqueeze(1) * cdf[:, -1:]) & (ranks > 0)
    picked = inverse_cdf(probs.masked_fill_(outside, 0.0), uniforms)
    return sorted_ids.gather(1, picked.unsqueeze(1)).squeeze(1)
