"""Linear layers in the weight format WORKER_QUANTIZATION picks, quantized at load from the
checkpoint's weights.

- `None`: the checkpoint's dtype, `F.linear`.
- `int8` (CPU): per-output-channel symmetric int8 weights, activations quantized per call (W8A8
  dynamic) through fbgemm's `quantized::linear_dynamic`, which on AVX2 multiplies int8 with
  `vpmaddubsw`: a quarter of fp32's weight bytes, and faster arithmetic too.
- `fp8` (CUDA; the CPU runs it too, slowly, so it is tested here): float8_e4m3 weights with one
  scale per output channel, activations quantized per token, `torch._scaled_mm` with row-wise scales.

Quantized weights are opaque to a compiled graph: fbgemm's packed weights are a TorchScript object
that torch.compile cannot take as an input, so each quantized GEMM is a custom op that finds its
packed weight by a handle.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpu_worker.settings import Quantization

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)

# Packed int8 weights by handle: custom ops take tensors and scalars, not TorchScript objects.
_packed: dict[int, tuple[Any, int]] = {}  # handle -> (packed params, out_features)


@torch.library.custom_op("cbserve::int8_linear", mutates_args=())
def int8_linear(x: torch.Tensor, handle: int) -> torch.Tensor:
    packed, _ = _packed[handle]
    shape = x.shape
    out = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).float(), packed, False)
    return out.view(*shape[:-1], out.shape[-1]).to(x.dtype)


@int8_linear.register_fake
def _(x: torch.Tensor, handle: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], _packed[handle][1]))


class Linear(nn.Module):
    """y = x W^T + b with W stored as `quantization` says."""

    weight_fp8: torch.Tensor
    weight_scale: torch.Tensor

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, quantization: Quantization | None
    ) -> None:
        super().__init__()
        self.quantization = quantization
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        if quantization is None:
            self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        elif quantization == "int8":
            self.handle = _pack_int8(weight.detach(), None if bias is None else bias.detach())
            self.bias = None  # packed with the weight
        else:
            w8, scale = quantize_fp8_rows(weight.detach())
            self.register_buffer("weight_fp8", w8)
            self.register_buffer("weight_scale", scale.view(1, -1))  # [1, N] float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantization is None:
            return F.linear(x, self.weight, self.bias)
        if self.quantization == "int8":
            return torch.ops.cbserve.int8_linear(x, self.handle)
        return self._fp8(x)

    def _fp8(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        x8, x_scale = quantize_fp8_rows(flat)
        out = torch._scaled_mm(
            x8,
            self.weight_fp8.t(),  # column-major, as _scaled_mm wants its second operand
            scale_a=x_scale.view(-1, 1),
            scale_b=self.weight_scale,
            bias=None if self.bias is None else self.bias.to(x.dtype),
            out_dtype=x.dtype if x.dtype != torch.float32 or x.device.type == "cpu" else torch.bfloat16,
        )
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, weights {self.quantization or 'as loaded'}"


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `x` [R, K] scaled to float8_e4m3's range: (x8 [R, K], scale [R] float32)."""
    scale = x.abs().amax(dim=-1).float().clamp(min=1e-12) / FP8_MAX
    x8 = (x.float() / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return x8, scale


def _pack_int8(weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    """fbgemm's packed int8 weight (symmetric, one scale per output channel), by handle."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
    zero_points = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch flags the quantized-tensor API for removal; fbgemm's op stays
        warnings.simplefilter("ignore")
        qweight = torch.quantize_per_channel(w, scale, zero_points, 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qweight, None if bias is None else bias.float())
    handle = len(_packed)
    _packed[handle] = (packed, int(weight.shape[0]))
    return handle


def check_quantization(quantization: Quantization | None, device: torch.device) -> None:
    """Refuse, by name, a format this device cannot run."""
    if quantization == "int8" and device.type != "cpu":
        raise ValueError("WORKER_QUANTIZATION=int8 runs on the CPU (fbgemm); on CUDA use fp8")
    if quantization == "int8" and "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ValueError("WORKER_QUANTIZATION=int8 needs torch's fbgemm engine, which this build lacks")
