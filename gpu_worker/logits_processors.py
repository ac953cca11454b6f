"""Batched edits of the logits before sampling: logit_bias, min_tokens, and the three penalties.

Order and semantics follow vLLM v1's sampler: logit_bias and the min_tokens mask first, then
repetition (HF: over prompt + output, positive logits divided, negative multiplied), frequency
(minus penalty x count in the output) and presence (minus penalty once if in the output). Each edit
touches only the rows that asked for it, with one tensor operation per edit, never a loop over the
vocabulary.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from common.protocol import SamplingParams


def apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    """Adds each row's bias in place; ids outside the logits were refused before they got here."""
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for row, p in enumerate(params):
        for token_id, bias in p.logit_bias.items():
            rows.append(row)
            cols.append(token_id)
            values.append(bias)
    if rows:
        device = logits.device
        index = (torch.tensor(rows, device=device), torch.tensor(cols, device=device))
        logits.index_put_(index, torch.tensor(values, device=device, dtype=logits.dtype), accumulate=True)


def apply_min_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    output_indices: Sequence[int],
    eos_token_ids: Collection[int],
) -> None:
    """Masks, in place, the tokens that would end a row that has not yet produced min_tokens."""
    rows: list[int] = []
    cols: list[int] = []
    for row, (p, index) in enumerate(zip(params, output_indices, strict=True)):
        if index >= p.min_tokens:
            continue
        stops = set(p.stop_token_ids) if p.ignore_eos else {*p.stop_token_ids, *eos_token_ids}
        rows.extend([row] * len(stops))
        cols.extend(stops)
    if rows:
        device = logits.device
        logits[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = float("-inf")


def token_counts(token_ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[R, vocab_size] occurrences of each token per row, built with one scatter_add."""
    width = max((len(ids) for ids in token_ids), default=0)
    # Padding uses an extra column (vocab_size) that is cut off afterwards.
    padded = [list(ids) + [vocab_size] * (width - len(ids)) for ids in token_ids]
    index = torch.tensor(padded, dtype=torch.long, device=device).view(len(token_ids), width)
    counts = torch.zeros(len(token_ids), vocab_size + 1, device=device)
    counts.scatter_add_(1, index, torch.ones(index.shape, device=device))
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
) -> None:
    """Repetition, frequency and presence penalties in place, for the rows that set any of them."""
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return
    device, vocab_size = logits.device, logits.shape[-1]
    index = torch.tensor(rows, device=device)
    chosen = [params[i] for i in rows]
    output_counts = token_counts([output_token_ids[i] for i in rows], vocab_size, device)
    in_output = output_counts > 0
    in_prompt = token_counts([prompt_token_ids[i] for i in rows], vocab_size, device) > 0

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, device=device, dtype=logits.dtype).unsqueeze(1)

    repetition = column([p.repetition_penalty for p in chosen])
    frequency = column([p.frequency_penalty for p in chosen])
    presence = column([p.presence_penalty for p in chosen])

    sub = logits[index]
    penalty = torch.where(in_prompt | in_output, repetition, torch.ones_like(repetition))
    sub = torch.where(sub > 0, sub / penalty, sub * penalty)
    sub = sub - frequency * output_counts - presence * in_output
    logits[index] = sub
