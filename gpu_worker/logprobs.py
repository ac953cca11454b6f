"""Log-probabilities of sampled tokens and of each row's most likely tokens.

They come from the model's raw distribution (`log_softmax` of the logits before logit_bias,
penalties, temperature or filtering), vLLM v1's default `logprobs_mode="raw_logprobs"`: what the
model believes, independent of how the token was then picked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from common.protocol import SamplingParams


@dataclass(slots=True, frozen=True)
class SampleLogprobs:
    logprob: float  # of the sampled token
    top_token_ids: list[int]  # the k most likely tokens, most likely first
    top_logprobs: list[float]


def compute_logprobs(
    raw_logits: torch.Tensor, params: Sequence[SamplingParams], sampled: torch.Tensor
) -> list[SampleLogprobs | None]:
    """Per row, None unless its params ask for logprobs; `sampled` [N] holds the chosen token ids."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    result: list[SampleLogprobs | None] = [None] * len(params)
    if not rows:
        return result
    index = torch.tensor(rows, device=raw_logits.device)
    logprobs = raw_logits[index].float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, sampled[index].unsqueeze(1)).squeeze(1).tolist()
    max_k = max(params[i].logprobs or 0 for i in rows)
    top_values, top_ids = logprobs.topk(max_k, dim=-1) if max_k else (logprobs[:, :0], logprobs[:, :0])
    top_values_list, top_ids_list = top_values.tolist(), top_ids.long().tolist()
    for j, row in enumerate(rows):
        k = params[row].logprobs or 0
        result[row] = SampleLogprobs(
            logprob=float(chosen[j]), top_token_ids=top_ids_list[j][:k], top_logprobs=top_values_list[j][:k]
        )
    return result
