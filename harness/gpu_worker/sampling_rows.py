"""Runs the device sampler on hand-made logits, one fresh `SamplingState` per call; token counts."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from common.protocol import SamplingParams
from gpu_worker.runner.sample.sampler import Sampler, SamplerOutput
from gpu_worker.runner.sample.sampling_state import SamplingState


def sample_rows(
    sampler: Sampler,
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    output_indices: Sequence[int],
    prompts: Sequence[Sequence[int]] = (),
    outputs: Sequence[Sequence[int]] = (),
    eos_token_ids: Collection[int] = (),
) -> SamplerOutput:
    """Row i samples output index `output_indices[i]`: its outputs so far are `outputs[i]` when
    given (penalties read them), else that many placeholder tokens."""
    state = SamplingState(logits.shape[1], logits.device, eos_token_ids)
    for row, (p, index) in enumerate(zip(params, output_indices, strict=True)):
        done = list(outputs[row]) if outputs else [0] * index
        assert len(done) == index, "the output index is the number of outputs so far"
        assert outputs or not p.has_penalties, "penalty rows need their real outputs"
        state.add(f"row{row}", p, prompts[row] if prompts else [], done)
    return sampler.launch(logits, state, [f"row{row}" for row in range(len(params))]).output()


def token_counts(token_ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[R, vocab_size] occurrences of each token per row, counted from scratch (the reference)."""
    width = max((len(ids) for ids in token_ids), default=0)
    # Padding uses an extra column (vocab_size) that is cut off afterwards.
    padded = [list(ids) + [vocab_size] * (width - len(ids)) for ids in token_ids]
    index = torch.tensor(padded, dtype=torch.long, device=device).view(len(token_ids), width)
    counts = torch.zeros(len(token_ids), vocab_size + 1, device=device)
    counts.scatter_add_(1, index, torch.ones(index.shape, device=device))
    return counts[:, :vocab_size]
