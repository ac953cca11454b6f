"""The Triton LoRA kernels as one opaque op per adapted linear (`cbserve::lora_delta`), so a compiled
forward (and a captured CUDA graph) calls them without a graph break. Imported only where the
`triton` kernel is chosen: Triton need not be installed on a CPU host."""

from __future__ import annotations

import torch

from gpu_worker.kernels.triton.lora import lora_expand, lora_shrink


@torch.library.custom_op("cbserve::lora_delta", mutates_args=())
def lora_delta(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: list[torch.Tensor],
    scale: torch.Tensor,
    order: torch.Tensor,
    starts: torch.Tensor,
    counts: torch.Tensor,
) -> torch.Tensor:
    """As step.py's `dense_delta`, for tokens sorted by slot (`make_lora_step`'s order, starts, counts)."""
    xa = lora_shrink(x.contiguous(), lora_a, scale, order, starts, counts)
    return lora_expand(xa, lora_b, order, starts, counts, x.dtype)


@lora_delta.register_fake
def _(x: torch.Tensor, lora_a: torch.Tensor, lora_b: list[torch.Tensor], *_: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], sum(b.shape[2] for b in lora_b)))
