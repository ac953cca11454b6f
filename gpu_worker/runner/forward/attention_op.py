"""Paged attention as an opaque custom op, so a compiled forward treats it as one call.

The op cannot take the step's metadata (Python objects) as an argument, so the step's
`AttentionContext` is set around the forward (`step_context`), as vLLM's forward context is, and the
op reads it: the compiled graph never sees it and never recompiles for it. The layer's K/V pools,
which it writes, are arguments (declared mutated), so they are inputs of the compiled graph.

On the CPU with the C++ kernels built, the decoder calls `cbserve_cpu::paged_attention` instead
(gpu_worker/kernels/cpu/paged_attention.cpp): the same contract, done in C++ for a step the backend
handed to it (`begin_step`), and passed on to this module's Python op otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from gpu_worker.kernels import cpu as cpu_kernels
from gpu_worker.runner.attention.backend import AttentionContext
from gpu_worker.runner.attention.variant import PLAIN, AttentionVariant

_current: list[AttentionContext] = []  # the context of the forward running now (at most one)


@contextlib.contextmanager
def step_context(context: AttentionContext) -> Iterator[None]:
    _current.append(context)
    context.backend.begin_step(context.metadata, context.common)
    try:
        yield
    finally:
        context.backend.end_step()
        _current.pop()


def native_attention(device: torch.device) -> bool:
    """Whether the decoder on `device` calls the C++ op."""
    return device.type == "cpu" and cpu_kernels.load()


# The layer's pools are arguments, declared mutated: a compiled graph then knows that the op writes
# them (functionalized, then written in place again by inductor: no copy of a pool).
@torch.library.custom_op("cbserve::paged_attention", mutates_args=("k_cache", "v_cache"))
def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """query [T, H, D], key/value [T, KVH, D] (after RoPE) -> [T, H, D]; writes K/V into the layer's
    pools `k_cache`/`v_cache` (the step's backend's `kv_cache.k_pools[layer]` and `v_pools[layer]`,
    which it writes and reads). `window`: the layer's sliding window
    (gpu_worker/runner/attention/variant.py), None for full causal attention."""
    if not _current:
        raise RuntimeError("cbserve::paged_attention runs only inside step_context(...)")
    context = _current[-1]
    variant = PLAIN if window is None else AttentionVariant(window=window)
    return context.backend.forward(
        layer, query.contiguous(), key.contiguous(), value.contiguous(), context.metadata, scale, variant
    )


@paged_attention.register_fake
def _(query: torch.Tensor, *_: object) -> torch.Tensor:
    return torch.empty_like(query, memory_format=torch.contiguous_format)


def layer_pools(context: AttentionContext) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The K and V pools of every layer the step's backend attends: what the op is given."""
    kv_cache = context.backend.kv_cache
    return list(kv_cache.k_pools), list(kv_cache.v_pools)
