"""Paged attention plugged into transformers through `AttentionInterface`.

The model runs one flattened ragged batch ([1, T] tokens of many requests). transformers computes
Q/K/V and RoPE as usual, then calls `paged_attention_forward` per layer with the step's
`AttentionContext` passed down as the `attn_metadata` forward kwarg (Llama forwards **kwargs from
`model(...)` to every attention call). The context's backend writes this step's K/V into the pool and
attends each request over its own cached K/V, so no DynamicCache and no dense [T, T] mask ever exists.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface

from gpu_worker.attention_backend import AttentionContext

ATTN_IMPLEMENTATION = "cbserve_paged"

# Attention kwargs of other architectures that change the result; none is implemented, and ignoring
# one would serve wrong text (Gemma 2's softcap, gpt-oss's sinks). A sliding window is refused only
# where it slides: within the window it is full attention (model_support.py lets such models load
# with WORKER_MAX_MODEL_LEN at most the window).
UNSUPPORTED_KWARGS = ("softcap", "s_aux", "sinks", "position_bias")


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
    window = kwargs.get("sliding_window")
    if window is not None and context.common.max_seq_len > window:
        unsupported.append(f"sliding_window={window} (a sequence of {context.common.max_seq_len} tokens)")
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
    )
    return out.unsqueeze(0), None


def register_paged_attention() -> str:
    """Make `ATTN_IMPLEMENTATION` loadable via `from_pretrained(attn_implementation=...)`; idempotent.

    Deliberately no `AttentionMaskInterface` entry: for an implementation without one, every
    `create_*_mask` of transformers returns None at once (masking_utils `_preprocess_mask_arguments`,
    "custom attention without equivalent mask creation"). Registering even a None-returning mask
    function would make it scan position_ids for packed sequences every step, a host sync on GPU.
    """
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
