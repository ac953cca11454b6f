"""Log-probabilities of sampled tokens and of each row's most likely tokens.

They come from the model's raw distribution (`log_softmax` of the logits before logit_bias,
penalties, temperature or filtering), vLLM v1's default `logprobs_mode="raw_logprobs"`: what the
model believes, independent of how the token was then picked. They are computed on the device and
come back with the sampled tokens in the step's one transfer (`sampler.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True, frozen=True)
class SampleLogprobs:
    logprob: float  # of the sampled token
    top_token_ids: list[int]  # the k most likely tokens, most likely first
    top_logprobs: list[float]


def compute_logprobs(
    raw_logits: torch.Tensor, rows: torch.Tensor, sampled: torch.Tensor, max_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For `rows` [R] of `raw_logits`: the logprob of the token in `sampled` [N], and the `max_k`
    largest logprobs with their token ids ([R], [R, max_k], [R, max_k])."""
    logprobs = raw_logits.index_select(0, rows).float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, sampled.index_select(0, rows).unsqueeze(1)).squeeze(1)
    if max_k == 0:
        return chosen, logprobs[:, :0], torch.zeros(rows.shape[0], 0, dtype=torch.long, device=rows.device)
    top_values, top_ids = logprobs.topk(max_k, dim=-1)
    return chosen, top_values, top_ids


def to_sample_logprobs(
    chosen: list[float], top_values: list[list[float]], top_ids: list[list[int]], ks: list[int]
) -> list[SampleLogprobs]:
    """Host-side records, each row cut to the k it asked for."""
    return [
        SampleLogprobs(logprob=float(c), top_token_ids=ids[:k], top_logprobs=values[:k])
        for c, values, ids, k in zip(chosen, top_values, top_ids, ks, strict=True)
    ]
