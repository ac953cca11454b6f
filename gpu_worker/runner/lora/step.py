"""One forward's LoRA inputs, and the grouped matmul that adds every adapter's delta at once.

The step's tokens name their adapter's slot in `lora_ids` [T] (-1: the base model), a tensor input of
the compiled forward, so changing adapters never recompiles; every shape depends only on `max_loras`
and `max_lora_rank`. Two ways to compute the same deltas:

- `dense` (the CPU): the shrink of every slot in one GEMM, `x [T, in] @ A [slots * n * R, in]^T`,
  each token's columns of other slots zeroed by a one-hot of its slot times the slot's scale, then one
  GEMM per projection over the slots' stacked B. Two plain GEMMs inside the compiled graph: at a few
  slots of small rank the work thrown away costs less than gathering each token's factors.
- `triton` (CUDA): the tokens sorted by slot once per forward, and Punica's shrink / expand kernels
  (gpu_worker/kernels/triton/lora.py) behind one opaque op per linear (triton_op.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

LoRAKernel = Literal["dense", "triton"]


@dataclass(frozen=True, slots=True)
class LoRAStep:
    """Per forward, made from `lora_ids` inside the compiled graph by `make_lora_step`."""

    kernel: LoRAKernel
    weights: torch.Tensor | None  # dense: [T, slots], 1.0 in each token's slot column, else 0
    order: torch.Tensor | None  # triton: [T] token indexes sorted by slot (base tokens last)
    starts: torch.Tensor | None  # triton: [slots] where each slot's tokens start in `order`
    counts: torch.Tensor | None  # triton: [slots] how many tokens each slot has


def make_lora_step(
    lora_ids: torch.Tensor, num_slots: int, kernel: LoRAKernel, dtype: torch.dtype
) -> LoRAStep:
    """From `lora_ids` [T] (a slot, or -1 for the base model)."""
    slots = torch.arange(num_slots, device=lora_ids.device)
    one_hot = lora_ids.unsqueeze(1) == slots.unsqueeze(0)  # [T, slots]; -1 matches none
    if kernel == "dense":
        return LoRAStep(kernel, one_hot.to(dtype), None, None, None)
    key = torch.where(lora_ids < 0, num_slots, lora_ids)
    counts = one_hot.sum(0, dtype=torch.int32)
    starts = torch.cumsum(counts, 0, dtype=torch.int32) - counts
    order = torch.argsort(key, stable=True).to(torch.int32)
    return LoRAStep(kernel, None, order, starts, counts)


def dense_delta(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: Sequence[torch.Tensor],
    scale: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """x [T, in], lora_a [slots, n * R, in], lora_b n x [slots, R, out_j], scale [slots, n] float32,
    weights [T, slots] -> [T, sum out_j]: each token's adapter delta, zeros for base tokens."""
    num_slots, n_cols, in_features = lora_a.shape
    num_proj = len(lora_b)
    rank = n_cols // num_proj
    xa = F.linear(x, lora_a.view(num_slots * n_cols, in_features))  # [T, slots * n * R]
    gate = weights.unsqueeze(2) * scale.to(weights.dtype).unsqueeze(0)  # [T, slots, n]
    xa = xa.view(-1, num_slots, num_proj, rank) * gate.unsqueeze(3)
    deltas = [
        xa[:, :, j].reshape(-1, num_slots * rank) @ b.view(num_slots * rank, b.shape[2])
        for j, b in enumerate(lora_b)
    ]
    return deltas[0] if num_proj == 1 else torch.cat(deltas, dim=-1)
