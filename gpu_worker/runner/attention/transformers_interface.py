"""Paged attention plugged into transformers through `AttentionInterface`.

The model runs one flattened ragged batch ([1, T] tokens of many requests). transformers computes
Q/K/V and RoPE as usual, then calls `paged_attention_forward` per layer with the step's
`AttentionContext` passed down as the `attn_metadata` forward kwarg (Llama forwards **kwargs from
`model(...)` to every attention call). The context's backend writes this step's K/V into the pool and
attends each request over its own cached K/V, so no DynamicCache and no dense [T, T] mask ever exists.
The layer's sliding window, logit softcap and sinks, which transformers passes as kwargs, go to the
backend as its `AttentionVariant`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface

from gpu_worker.runner.attention.backend import AttentionContext
from gpu_worker.runner.attention.variant import AttentionVariant

ATTN_IMPLEMENTATION = "cbserve_paged"

# Attention kwargs of other architectures that change the result and are not implemented: ignoring
# one would serve wrong text (gpu_worker/runner/model_support.py refuses such models at load).
UNSUPPORTED_KWARGS = ("position_bias", "indices")


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key/value [1, KVH, T, D] (after RoPE) -> output [1, T, H, D]."""
    context: AttentionContext | None = kwargs.get("attn_metadata")
    if context is None:
        raise RuntimeError(f"{ATTN_IMPLEMENTATION} attention needs attn_metadata=AttentionContext(...)")
    unsupported = [name for name in UNSUPPORTED_KWARGS if kwargs.get(name) is not None]
    if unsupported or dropout:
        raise NotImplementedError(
            f"{ATTN_IMPLEMENTATION} attention does not implement "
            f"{', '.join(unsupported) or f'dropout={dropout}'} (model {type(module).__name__})"
        )
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = context.backend.forward(
        int(module.layer_idx),  # type: ignore[arg-type]
        query[0].transpose(0, 1),  # [T, H, D]
        key[0].transpose(0, 1),  # [T, KVH, D]
        value[0].transpose(0, 1),
        context.metadata,
        scale,
        variant_of(kwargs),
    )
    return out.unsqueeze(0), None


def variant_of(kwargs: dict[str, Any]) -> AttentionVariant:
    """The variant transformers asks of this call (gpt-oss passes its sinks as `s_aux`, others as
    `sinks`)."""
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    return AttentionVariant(
        window=None if window is None else int(window),
        softcap=None if softcap is None else float(softcap),
        sinks=kwargs.get("sinks") if sinks is None else sinks,
    )


def register_paged_attention() -> str:
    """Make `ATTN_IMPLEMENTATION` loadable via `from_pretrained(attn_implementation=...)`; idempotent.

    Deliberately no `AttentionMaskInterface` entry: for an implementation without one, every
    `create_*_mask` of transformers returns None at once (masking_utils `_preprocess_mask_arguments`,
    "custom attention without equivalent mask creation"). Registering even a None-returning mask
    function would make it scan position_ids for packed sequences every step, a host sync on GPU.
    """
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
