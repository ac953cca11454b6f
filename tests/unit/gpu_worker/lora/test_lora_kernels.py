"""The grouped LoRA matmul against a per-token torch reference: Punica-style Triton shrink / expand
(gpu_worker/kernels/triton/lora.py) under Triton's interpreter on CPU tensors, and the dense masked
matmul the CPU runs (gpu_worker/runner/lora/step.py), both through `make_lora_step` as the decoder
calls them. Ragged slots (one with more tokens than a program takes, one with none), zero-padded
ranks, base-model tokens, sizes that are no multiple of the kernels' tiles, float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from gpu_worker.runner.lora.step import LoRAKernel, dense_delta, make_lora_step
from gpu_worker.runner.lora.triton_op import lora_delta
from harness.gpu_worker.paged_steps import DEVICE

SLOTS = 3
RANK = 8  # max_lora_rank: the slots' rank; each slot's adapter has its own below it
IN_FEATURES = 40
OUTS = [72, 24, 24]  # q, k, v: the fused output's column ranges
SLOT_RANKS = [8, 4, 2]


def factors(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """Stacked slots as layers.py holds them: A [slots, n * R, in], B_j [slots, R, out_j], scale
    [slots, n]; each slot's rank zero-padded to R, and slot 1 without its second projection."""
    g = torch.Generator().manual_seed(seed)
    num = len(OUTS)
    lora_a = torch.zeros(SLOTS, num * RANK, IN_FEATURES)
    lora_b = [torch.zeros(SLOTS, RANK, out) for out in OUTS]
    scale = torch.zeros(SLOTS, num)
    for slot, rank in enumerate(SLOT_RANKS):
        for j in range(num):
            if slot == 1 and j == 1:
                continue  # an adapter that does not target k_proj
            lora_a[slot, j * RANK : j * RANK + rank] = torch.randn(rank, IN_FEATURES, generator=g)
            lora_b[j][slot, :rank] = torch.randn(rank, OUTS[j], generator=g)
            scale[slot, j] = 0.5 + slot + j
    return lora_a.to(DEVICE, dtype), [b.to(DEVICE, dtype) for b in lora_b], scale.to(DEVICE)


def token_slots() -> torch.Tensor:
    """37 tokens: slot 0 has 20 (two programs' worth), slot 1 has 9, slot 2 none, 8 base tokens."""
    slots = [0] * 20 + [1] * 9 + [-1] * 8
    order = torch.randperm(len(slots), generator=torch.Generator().manual_seed(1))
    return torch.tensor(slots)[order].to(DEVICE)


def reference(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: list[torch.Tensor],
    scale: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Each token alone, in float64: scale * (x A_j^T) B_j per projection, zeros for the base model."""
    out = torch.zeros(x.shape[0], sum(OUTS), dtype=torch.float64)
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        col = 0
        for j, b in enumerate(lora_b):
            a = lora_a[slot, j * RANK : (j + 1) * RANK].double()
            xa = (x[t].double() @ a.T) * float(scale[slot, j])
            out[t, col : col + OUTS[j]] = xa @ b[slot].double()
            col += OUTS[j]
    return out


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol): float32 as exact as the sums' order allows; bfloat16 one rounding of each factor."""
    return (1e-4, 1e-5) if dtype == torch.float32 else (0.5, 3e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", ["triton", "dense"])
def test_grouped_delta_equals_each_token_alone(kernel: LoRAKernel, dtype: torch.dtype) -> None:
    lora_a, lora_b, scale = factors(dtype)
    slots = token_slots()
    x = torch.randn(slots.shape[0], IN_FEATURES, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    step = make_lora_step(slots, SLOTS, kernel, dtype)
    if kernel == "triton":
        assert step.order is not None and step.starts is not None and step.counts is not None
        assert step.counts.tolist() == [20, 9, 0] and step.starts.tolist() == [0, 20, 29]
        delta = lora_delta(x, lora_a, lora_b, scale, step.order, step.starts, step.counts)
    else:
        assert step.weights is not None
        delta = dense_delta(x, lora_a, lora_b, scale, step.weights)
    assert delta.dtype == dtype and delta.shape == (slots.shape[0], sum(OUTS))
    expected = reference(x.float(), lora_a.float(), [b.float() for b in lora_b], scale, slots.cpu())
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(delta.double().cpu(), expected, atol=atol, rtol=rtol)
    assert not delta[slots < 0].any()  # base-model tokens get nothing


def test_a_step_of_base_tokens_only_and_an_empty_step() -> None:
    lora_a, lora_b, scale = factors(torch.float32)
    for num_tokens in (5, 0):
        slots = torch.full((num_tokens,), -1, device=DEVICE)
        x = torch.randn(num_tokens, IN_FEATURES, device=DEVICE)
        step = make_lora_step(slots, SLOTS, "triton", torch.float32)
        assert step.order is not None and step.starts is not None and step.counts is not None
        delta = lora_delta(x, lora_a, lora_b, scale, step.order, step.starts, step.counts)
        assert delta.shape == (num_tokens, sum(OUTS)) and not delta.any()
