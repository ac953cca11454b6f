"""Counter-based uniforms for seeded requests: splitmix64 of (seed, output index) in int64 tensor ops.

A seeded request's draw at output index i is a pure function of (seed, i), computed on the device
with no generator state, so it does not depend on the batch it shares, nor on preemption and
resume. int64 arithmetic wraps like uint64; right shifts are made logical with a mask.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_GOLDEN, _MUL1, _MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def mix64(x: int) -> int:
    """splitmix64's finaliser on a Python int in [0, 2**64): the reference for `mix64_tensor`."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * _MUL1) & _MASK64
    x = ((x ^ (x >> 27)) * _MUL2) & _MASK64
    return x ^ (x >> 31)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64_tensor(x: torch.Tensor) -> torch.Tensor:
    """`mix64` on int64 tensors holding the same 64 bits (two's complement)."""
    x = x + _signed(_GOLDEN)
    x = (x ^ _shift_right(x, 30)) * _signed(_MUL1)
    x = (x ^ _shift_right(x, 27)) * _signed(_MUL2)
    return x ^ _shift_right(x, 31)


def seeded_uniforms(mixed_seeds: torch.Tensor, output_indices: torch.Tensor) -> torch.Tensor:
    """float32 uniforms in [0, 1), 24 random bits each, for int64 `mix64(seed)` values and indices."""
    bits = _shift_right(mix64_tensor(mixed_seeds ^ output_indices), 40)
    return bits.to(torch.float32) * (1.0 / (1 << 24))


def seeded_uniform(seed: int, index: int) -> float:
    """The uniform a request with `seed` draws for output token `index` (pure Python, for tests)."""
    return (mix64(mix64(seed & _MASK64) ^ (index & _MASK64)) >> 40) / (1 << 24)
