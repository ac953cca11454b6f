"""Linear layers in the weight format WORKER_QUANTIZATION picks, quantized at load from the
checkpoint's weights.

- `None`: the checkpoint's dtype. On the CPU at float32 the weight is reordered once, at load, into
  oneDNN's blocked layout and multiplied by oneDNN (`cbserve_cpu::packed_linear`, a C++ op opaque to
  inductor, whose own lowering of that call accepts only weights frozen into the graph): MKL's sgemm,
  which `F.linear` calls, takes a slow path on AMD hosts, and a packed weight is read in the order the
  kernel walks it. Elsewhere, and without a C++ compiler, `F.linear`.
- `int8` (CPU): int8 weights with one scale per output channel, activations quantized per token at
  each call (W8A8 dynamic), multiplied by `torch._int_mm` (int8 x int8 -> int32): a quarter of fp32's
  weight bytes and int8 arithmetic. Per-token activation scales, not one per tensor (fbgemm's
  `linear_dynamic`), keep a row of large activations from flattening the others' precision.
- `fp8` (CUDA; the CPU runs it too, slowly, so it is tested here): float8_e4m3 weights with one
  scale per output channel, activations quantized per token, `torch._scaled_mm` with row-wise scales.

Both are plain aten ops, so a compiled graph fuses the activations' quantization and the scaling into
the kernels around the GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpu_worker.kernels import cpu as cpu_kernels
from gpu_worker.settings import Quantization

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)
INT8_MAX = 127.0


# The token count the weight's blocked layout is chosen for: a decode step of 16 sequences.
PACK_ROWS_HINT = 16


def packs_on_cpu(weight: torch.Tensor) -> bool:
    """Whether `weight` is packed for oneDNN: float32 on a CPU with oneDNN, where the C++ kernels
    (gpu_worker/kernels/cpu/, built with the host's compiler) hold the op that multiplies by it."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and cpu_kernels.load()
    )


class Linear(nn.Module):
    """y = x W^T + b with W stored as `quantization` says."""

    weight_packed: torch.Tensor  # float32 in oneDNN's blocked layout (torch._mkldnn), [out, in]
    weight_q: torch.Tensor  # int8 [in, out] (the layout torch._int_mm reads) or float8 [out, in]
    weight_scale: torch.Tensor  # [1, out] float32

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, quantization: Quantization | None
    ) -> None:
        super().__init__()
        self.quantization = quantization
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.packed = quantization is None and packs_on_cpu(weight)
        if self.packed:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS_HINT)
            self.register_buffer("weight_packed", packed)
            return
        if quantization is None:
            self.weight = nn.Parameter(weight.detach(), requires_grad=False)
            return
        quantize = quantize_int8_rows if quantization == "int8" else quantize_fp8_rows
        weight_q, scale = quantize(weight.detach())
        self.register_buffer("weight_q", weight_q.t().contiguous() if quantization == "int8" else weight_q)
        self.register_buffer("weight_scale", scale.view(1, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.cbserve_cpu.packed_linear(x, self.weight_packed, self.bias, self.out_features)
        if self.quantization is None:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, self.in_features)
        if self.quantization == "int8":
            x8, x_scale = quantize_int8_rows(flat)
            out = torch._int_mm(x8, self.weight_q).float() * x_scale.view(-1, 1) * self.weight_scale
            if self.bias is not None:
                out = out + self.bias.float()
        else:
            out = self._fp8(flat)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _fp8(self, flat: torch.Tensor) -> torch.Tensor:
        x8, x_scale = quantize_fp8_rows(flat)
        return torch._scaled_mm(
            x8,
            self.weight_q.t(),  # column-major, as _scaled_mm wants its second operand
            scale_a=x_scale.view(-1, 1),
            scale_b=self.weight_scale,
            bias=None if self.bias is None else self.bias.to(flat.dtype),
            out_dtype=flat.dtype
            if flat.dtype != torch.float32 or flat.device.type == "cpu"
            else torch.bfloat16,
        )

    def extra_repr(self) -> str:
        weights = self.quantization or ("packed for oneDNN" if self.packed else "as loaded")
        return f"{self.in_features} -> {self.out_features}, weights {weights}"


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `x` [R, K] scaled to float8_e4m3's range: (x8 [R, K], scale [R] float32)."""
    scale = x.abs().amax(dim=-1).float().clamp(min=1e-12) / FP8_MAX
    x8 = (x.float() / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return x8, scale


def quantize_int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `x` [R, K] rounded to symmetric int8: (x8 [R, K], scale [R] float32)."""
    scale = x.abs().amax(dim=-1).float().clamp(min=1e-12) / INT8_MAX
    x8 = torch.round(x.float() / scale.unsqueeze(-1)).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return x8, scale


def check_quantization(quantization: Quantization | None, device: torch.device) -> None:
    """Refuse, by name, a format this device cannot run."""
    if quantization == "int8" and device.type != "cpu":
        raise ValueError("WORKER_QUANTIZATION=int8 runs on the CPU; on CUDA use fp8")
