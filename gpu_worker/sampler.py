"""Next-token sampling: greedy, temperature, min-p, top-k and top-p, one row of logits per request.

Before sampling, rows that ask for them get logit_bias, the min_tokens mask and penalties
(`logits_processors.py`); rows that ask for logprobs get them from the raw logits (`logprobs.py`).
A batch where nobody asks for any of that takes the plain path: greedy is a bare argmax.

Randomness is drawn as one uniform number per row, then turned into a token by inverse CDF over the
row's filtered distribution. A seeded request draws its number from a generator seeded by
(seed, output index), so its token depends only on its own logits and that pair: never on the
other requests in the batch, nor on preemption and resume (which recompute the same logits).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from common.protocol import SamplingParams
from gpu_worker.logits_processors import apply_logit_bias, apply_min_tokens, apply_penalties
from gpu_worker.logprobs import SampleLogprobs, compute_logprobs

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    # splitmix64 finaliser: spreads (seed, index) over all bits; the CPU generator keeps only 32 of them.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def seeded_uniform(seed: int, index: int) -> float:
    """The uniform number in [0, 1) that a request with `seed` uses for output token `index`."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(_mix64(_mix64(seed & _MASK64) ^ (index & _MASK64)))
    return float(torch.rand((), generator=generator, dtype=torch.float64))


@dataclass(slots=True, frozen=True)
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[SampleLogprobs | None]  # one per row, None where the request did not ask


class Sampler:
    """Turns logits into token ids; owns the generator used by requests without a seed."""

    def __init__(self, seed: int | None = None, eos_token_ids: Collection[int] = ()) -> None:
        self._generator = torch.Generator(device="cpu")
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._eos_token_ids = frozenset(eos_token_ids)  # masked by min_tokens

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        output_indices: Sequence[int],
        prompt_token_ids: Sequence[Sequence[int]] = (),
        output_token_ids: Sequence[Sequence[int]] = (),
    ) -> SamplerOutput:
        """logits [N, V]; per row: params, output index of the token being sampled and, for rows with
        penalties, the prompt and output token ids (other rows may pass empty lists)."""
        num_rows = logits.shape[0]
        if num_rows == 0:
            return SamplerOutput([], [])
        raw_logits = logits
        if any(p.logit_bias or p.min_tokens or p.has_penalties for p in params):
            logits = logits.float().clone()  # the raw logits stay intact for logprobs
            apply_logit_bias(logits, params)
            apply_min_tokens(logits, params, output_indices, self._eos_token_ids)
            apply_penalties(logits, params, prompt_token_ids, output_token_ids)
        tokens = torch.empty(num_rows, dtype=torch.long, device=logits.device)
        greedy_rows = [i for i, p in enumerate(params) if p.greedy]
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if greedy_rows:
            rows = torch.tensor(greedy_rows, device=logits.device)
            tokens[rows] = logits[rows].argmax(dim=-1)
        if random_rows:
            rows = torch.tensor(random_rows, device=logits.device)
            chosen = [params[i] for i in random_rows]
            uniforms = self._uniforms(chosen, [output_indices[i] for i in random_rows])
            tokens[rows] = sample_filtered(logits[rows], chosen, uniforms.to(logits.device))
        return SamplerOutput([int(t) for t in tokens.tolist()], compute_logprobs(raw_logits, params, tokens))

    def _uniforms(self, params: Sequence[SamplingParams], output_indices: Sequence[int]) -> torch.Tensor:
        unseeded = sum(1 for p in params if p.seed is None)
        shared = torch.rand(unseeded, generator=self._generator, dtype=torch.float64).tolist()
        values: list[float] = []
        for p, index in zip(params, output_indices, strict=True):
            values.append(shared.pop() if p.seed is None else seeded_uniform(p.seed, index))
        return torch.tensor(values, dtype=torch.float64)


def sample_filtered(
    logits: torch.Tensor, params: Sequence[SamplingParams], uniforms: torch.Tensor
) -> torch.Tensor:
    """Apply temperature, then min-p, top-k and top-p per row, and pick by inverse CDF at `uniforms`
    ([N] in [0, 1))."""
    device = logits.device
    temperature = torch.tensor([max(p.temperature, 1e-5) for p in params], device=device)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else logits.shape[-1] for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float64)
    min_p = torch.tensor([p.min_p for p in params], device=device, dtype=torch.float64)

    scaled = logits.float() / temperature.unsqueeze(1)
    sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1).double()
    ranks = torch.arange(probs.shape[-1], device=device).unsqueeze(0)
    # Keep a token if it is within top-k, the mass before it is still under top-p, and it is at least
    # min_p times as likely as the most likely token (rank 0); rank 0 always stays.
    mass_before = probs.cumsum(dim=-1) - probs
    within_p = (mass_before < top_p.unsqueeze(1)) | (top_p.unsqueeze(1) >= 1.0)
    within_min_p = probs >= min_p.unsqueeze(1) * probs[:, :1]
    keep = (ranks < top_k.unsqueeze(1)) & within_p & within_min_p
    keep[:, 0] = True
    probs = probs * keep
    cdf = probs.cumsum(dim=-1)
    targets = uniforms.to(torch.float64).unsqueeze(1) * cdf[:, -1:]
    picked = torch.searchsorted(cdf, targets, right=True).squeeze(1)
    # Rounding can put the target at the very top of the CDF; the last kept rank is the right answer then.
    picked = torch.minimum(picked, keep.sum(dim=-1) - 1)
    return sorted_ids.gather(1, picked.unsqueeze(1)).squeeze(1)
