"""Batched edits of the logits before sampling: logit_bias, min_tokens, and the three penalties.

Order and semantics follow vLLM v1's sampler: logit_bias and the min_tokens mask first, then
repetition (HF: over prompt + output, positive logits divided, negative multiplied), frequency
(minus penalty x count in the output) and presence (minus penalty once if in the output). Each edit
is a few tensor operations over the rows' parameters kept in `SamplingState`, never a loop over the
vocabulary or the rows.

A structured-output row whose grammar allows only stop tokens while min_tokens masks them would have
no token left; `restore_emptied_rows` gives it back the grammar's choice (the grammar wins).
"""

from __future__ import annotations

import torch


def apply_logit_bias(logits: torch.Tensor, bias_ids: torch.Tensor, bias_values: torch.Tensor) -> None:
    """Adds each row's bias in place: `bias_ids` / `bias_values` [N, W], padded with (0, 0.0)."""
    logits.scatter_add_(1, bias_ids, bias_values.to(logits.dtype))


def apply_min_tokens(
    logits: torch.Tensor, stop_ids: torch.Tensor, output_indices: torch.Tensor, min_tokens: torch.Tensor
) -> None:
    """Masks, in place, the tokens that would end a row that has not yet produced min_tokens.

    `stop_ids` [N, W] holds each row's EOS / stop ids (padded by repeating one); rows whose
    `output_indices` [N] reached `min_tokens` [N] keep their logits."""
    values = logits.gather(1, stop_ids)
    active = (output_indices < min_tokens).unsqueeze(1)
    logits.scatter_(1, stop_ids, values.masked_fill(active, float("-inf")))


def restore_emptied_rows(logits: torch.Tensor, rows: torch.Tensor, before: torch.Tensor) -> None:
    """Rows of `rows` [R] left with no possible token get back their logits `before` [R, V]."""
    after = logits.index_select(0, rows)
    emptied = torch.isneginf(after).all(dim=-1, keepdim=True)
    logits.index_copy_(0, rows, torch.where(emptied, before, after))


def apply_penalties(
    logits: torch.Tensor,
    rows: torch.Tensor,
    prompt_mask: torch.Tensor,
    output_counts: torch.Tensor,
    penalties: torch.Tensor,
) -> None:
    """Repetition, frequency and presence penalties in place on `rows` [R] of `logits`.

    `prompt_mask` [R, V] marks tokens in each row's prompt, `output_counts` [R, V] counts them in
    its output, `penalties` [R, 3] holds (repetition, frequency, presence)."""
    repetition, frequency, presence = (penalties[:, i : i + 1].to(logits.dtype) for i in range(3))
    in_output = output_counts > 0
    sub = logits.index_select(0, rows)
    penalty = torch.where(prompt_mask | in_output, repetition, torch.ones_like(repetition))
    sub = torch.where(sub > 0, sub / penalty, sub * penalty)
    sub = sub - frequency * output_counts - presence * in_output
    logits.index_copy_(0, rows, sub)
