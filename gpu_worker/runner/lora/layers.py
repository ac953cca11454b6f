"""Each decoder layer's LoRA slots: the factors of up to `max_loras` adapters, stacked per linear.

The decoder's linears are fused (q/k/v one GEMM, gate/up another, vLLM's QKVParallelLinear /
MergedColumnParallelLinear), so the adapters' factors are grouped the same way: one A for the
projections that share an input, `[slots, n * R, in]`, projection j in rows j*R .. j*R + R, and one B
per projection, `[slots, R, out_j]`, whose deltas land in that projection's columns of the fused
output. R is `max_lora_rank`: a smaller rank is zero-padded, and a projection an adapter does not
target is all zeros, which adds nothing. The buffers are the compiled forward's inputs like the
weights: loading an adapter copies into them in place, and nothing recompiles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gpu_worker.runner.lora.step import LoRAKernel, LoRAStep, dense_delta

# The fused linears of a layer, and the PEFT module names each holds, in its column order.
GROUPS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


@dataclass(frozen=True, slots=True)
class LoRAConfig:
    """What the slots are sized by (WORKER_MAX_LORAS, WORKER_MAX_LORA_RANK) and how deltas are computed."""

    max_loras: int
    max_lora_rank: int
    kernel: LoRAKernel


@dataclass(frozen=True, slots=True)
class Factors:
    """One adapted linear of an adapter, as PEFT saved it: A [r, in], B [out, r], and its scaling."""

    lora_a: torch.Tensor
    lora_b: torch.Tensor
    scaling: float


class LoRAGroup(nn.Module):
    """The slots of one fused linear."""

    lora_a: torch.Tensor  # [slots, n * R, in]
    scale: torch.Tensor  # [slots, n] float32: each slot's scaling per projection

    def __init__(
        self,
        modules: Sequence[str],
        in_features: int,
        out_features: Sequence[int],
        config: LoRAConfig,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.modules_names = tuple(modules)
        self.rank = config.max_lora_rank
        self.kernel = config.kernel
        slots, rank, num = config.max_loras, config.max_lora_rank, len(modules)
        self.register_buffer(
            "lora_a", torch.zeros(slots, num * rank, in_features, dtype=dtype, device=device)
        )
        for j, out in enumerate(out_features):
            self.register_buffer(f"lora_b{j}", torch.zeros(slots, rank, out, dtype=dtype, device=device))
        self.register_buffer("scale", torch.zeros(slots, num, dtype=torch.float32, device=device))

    @property
    def lora_b(self) -> list[torch.Tensor]:
        return [getattr(self, f"lora_b{j}") for j in range(len(self.modules_names))]

    def delta(self, x: torch.Tensor, step: LoRAStep) -> torch.Tensor:
        """x [T, in] -> [T, sum out]: what the step's adapters add to this linear's output."""
        if step.kernel == "triton":
            assert step.order is not None and step.starts is not None and step.counts is not None
            return torch.ops.cbserve.lora_delta(
                x, self.lora_a, self.lora_b, self.scale, step.order, step.starts, step.counts
            )
        assert step.weights is not None
        return dense_delta(x, self.lora_a, self.lora_b, self.scale, step.weights)

    def load(self, slot: int, factors: Mapping[str, Factors]) -> None:
        """Slot `slot` holds these factors (by module name); the projections not among them add nothing."""
        rank = self.rank
        self.lora_a[slot].zero_()
        self.scale[slot].zero_()
        for j, (module, lora_b) in enumerate(zip(self.modules_names, self.lora_b, strict=True)):
            lora_b[slot].zero_()
            f = factors.get(module)
            if f is None:
                continue
            r = f.lora_a.shape[0]
            self.lora_a[slot, j * rank : j * rank + r].copy_(f.lora_a, non_blocking=True)
            lora_b[slot, :r].copy_(f.lora_b.t(), non_blocking=True)
            self.scale[slot, j] = f.scaling


class LoRALayer(nn.Module):
    """The slots of one decoder layer's four fused linears."""

    def __init__(
        self,
        hidden_size: int,
        q_size: int,
        kv_size: int,
        intermediate_size: int,
        config: LoRAConfig,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        if config.kernel == "triton":
            import gpu_worker.runner.lora.triton_op  # noqa: F401  registers cbserve::lora_delta

        def group(name: str, in_features: int, outs: Sequence[int]) -> LoRAGroup:
            return LoRAGroup(GROUPS[name], in_features, outs, config, dtype, device)

        self.qkv = group("qkv", hidden_size, [q_size, kv_size, kv_size])
        self.o = group("o", q_size, [hidden_size])
        self.gate_up = group("gate_up", hidden_size, [intermediate_size, intermediate_size])
        self.down = group("down", intermediate_size, [hidden_size])

    def load(self, slot: int, factors: Mapping[str, Factors]) -> None:
        """Slot `slot` holds this layer's factors of one adapter (by module name)."""
        for group in (self.qkv, self.o, self.gate_up, self.down):
            group.load(slot, factors)
