"""Prompt logprobs (vLLM's `prompt_logprobs`), computed in the prefill's own forward.

A prompt chunk computing positions [c, e) has hidden states there; the logits at position p give the
distribution of token p + 1. For a request that asked, the step keeps the logits of its prompt
positions that predict a prompt token (p + 1 < prompt length; the last prompt position samples the
first output token as usual), as extra `logits_to_keep` rows after the sampling rows, so the model's
head runs over no other position. Each chunk's log-softmax is taken on the device and its rows
accumulate on the request until the prompt is done; then they travel in one `PromptEvent`.
Like sampled-token logprobs they come from the raw distribution (`logprobs.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_ROWS_PER_SLICE = 256


@dataclass(slots=True)
class PromptLogprobs:
    """What a request collected so far: entry i is about prompt token i + 1."""

    k: int  # most likely tokens kept per entry
    logprobs: list[float] = field(default_factory=list)
    top_token_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)

    def put(
        self, start: int, logprobs: list[float], top_ids: list[list[int]], top_values: list[list[float]]
    ) -> None:
        """Entries from `start` on; a step rerun after a failure writes the same entries again."""
        del self.logprobs[start:], self.top_token_ids[start:], self.top_logprobs[start:]
        self.logprobs += logprobs
        self.top_token_ids += [ids[: self.k] for ids in top_ids]
        self.top_logprobs += [values[: self.k] for values in top_values]


@dataclass(slots=True, frozen=True)
class PromptRows:
    """One request's prompt positions in this step's kept logits (laid out by
    gpu_worker/runner/input_batch.py)."""

    logprobs: PromptLogprobs  # the request's, which its entries go to
    start: int  # first position (= first entry index)
    num_rows: int


def collect_prompt_logprobs(logits: torch.Tensor, targets: torch.Tensor, rows: list[PromptRows]) -> None:
    """`logits` [R, V] of the step's prompt rows, `targets` [R]: each request's entries, appended."""
    max_k = max(r.logprobs.k for r in rows)
    chosen, top_values, top_ids = [], [], []
    # A long prompt chunk has many rows: its float32 log-softmax is taken a slice of rows at a time.
    for lo in range(0, logits.shape[0], _ROWS_PER_SLICE):
        logprobs = logits[lo : lo + _ROWS_PER_SLICE].float().log_softmax(dim=-1)
        chosen.append(logprobs.gather(1, targets[lo : lo + _ROWS_PER_SLICE].unsqueeze(1)).squeeze(1))
        values, ids = logprobs.topk(max_k, dim=-1)
        top_values.append(values)
        top_ids.append(ids)
    chosen_host = torch.cat(chosen).tolist()
    values_host, ids_host = torch.cat(top_values).tolist(), torch.cat(top_ids).tolist()
    at = 0
    for r in rows:
        end = at + r.num_rows
        r.logprobs.put(r.start, chosen_host[at:end], ids_host[at:end], values_host[at:end])
        at = end
