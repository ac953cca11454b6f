"""Paged attention plugged into transformers through `AttentionInterface`.

The model runs one flattened ragged batch ([1, T] tokens of many requests). transformers computes
Q/K/V and RoPE as usual, then calls `paged_attention_forward` per layer with the step's
`AttentionMetadata` passed down as the `attn_metadata` forward kwarg (Llama forwards **kwargs from
`model(...)` to every attention call). The function writes this step's K/V into the pool and attends
each request over its own cached K/V, so no DynamicCache and no dense [T, T] mask ever exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from gpu_worker.kv_cache import KVCache

ATTN_IMPLEMENTATION = "cbserve_paged"


@dataclass(slots=True)
class PrefillChunk:
    """One request's run of several query tokens (a prompt chunk) inside the flattened batch."""

    start: int  # index of its first token in the flattened batch
    end: int  # one past its last token
    block_table: torch.Tensor  # [nb] blocks covering positions 0 .. context_len - 1
    context_len: int  # tokens it attends over: already cached + this chunk
    # [q, context_len] bool, True = may attend; None when the chunk starts at position 0 (plain causal)
    causal_mask: torch.Tensor | None


@dataclass(slots=True)
class DecodeGroup:
    """Single-token queries of similar context length, attended with one gather and one SDPA."""

    start: int  # index of its first query in the flattened batch (decodes come first)
    end: int  # one past its last
    block_tables: torch.Tensor  # [b, nb] padded with block 0 (masked out)
    # [b, 1, 1, nb * block_size] bool, True below each context length; None when every table is full
    mask: torch.Tensor | None


@dataclass(slots=True)
class AttentionMetadata:
    """Everything the attention layers need for one step; built once, shared by all layers."""

    kv_cache: KVCache
    slot_mapping: torch.Tensor  # [T] flat pool slot of every token of the step
    decodes: list[DecodeGroup]  # the batch starts with its single-token decodes, longest context first
    prefills: list[PrefillChunk]


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
    meta: AttentionMetadata | None = kwargs.get("attn_metadata")
    if meta is None:
        raise RuntimeError(f"{ATTN_IMPLEMENTATION} attention needs attn_metadata=AttentionMetadata(...)")
    layer = int(module.layer_idx)  # type: ignore[arg-type]
    q = query[0].transpose(0, 1)  # [T, H, D]
    k = key[0].transpose(0, 1)  # [T, KVH, D]
    v = value[0].transpose(0, 1)
    meta.kv_cache.write(layer, meta.slot_mapping, k, v)

    out = torch.empty_like(q)
    for group in meta.decodes:
        _decode(meta, layer, group, q[group.start : group.end], scaling, out[group.start : group.end])
    for chunk in meta.prefills:
        _prefill(meta, layer, chunk, query, key, value, scaling, out[chunk.start : chunk.end])
    return out.unsqueeze(0), None


def _decode(
    meta: AttentionMetadata,
    layer: int,
    group: DecodeGroup,
    q: torch.Tensor,
    scaling: float | None,
    out: torch.Tensor,
) -> None:
    # A group's single-token queries in one gather and one SDPA: [b, H, 1, D] over [b, KVH, L, D].
    k_cache, v_cache = meta.kv_cache.gather(layer, group.block_tables)
    attn = F.scaled_dot_product_attention(
        q.unsqueeze(2),
        k_cache.transpose(1, 2),
        v_cache.transpose(1, 2),
        attn_mask=group.mask,
        scale=scaling,
        enable_gqa=True,
    )
    out.copy_(attn.squeeze(2))


def _prefill(
    meta: AttentionMetadata,
    layer: int,
    chunk: PrefillChunk,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    out: torch.Tensor,
) -> None:
    q = query[:, :, chunk.start : chunk.end]  # [1, H, q, D]
    if chunk.causal_mask is None:
        # Nothing cached before this chunk: its own K/V are the whole context, no pool read needed.
        k = key[:, :, chunk.start : chunk.end]
        v = value[:, :, chunk.start : chunk.end]
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=True)
    else:
        # Later chunk of a prompt: read earlier chunks back through the block table, causal by position.
        k_cache, v_cache = meta.kv_cache.gather(layer, chunk.block_table.unsqueeze(0))
        k = k_cache[:, : chunk.context_len].transpose(1, 2)
        v = v_cache[:, : chunk.context_len].transpose(1, 2)
        attn = F.scaled_dot_product_attention(
            q, k, v, attn_mask=chunk.causal_mask, scale=scaling, enable_gqa=True
        )
    out.copy_(attn[0].transpose(0, 1))


def register_paged_attention() -> str:
    """Make `ATTN_IMPLEMENTATION` loadable via `from_pretrained(attn_implementation=...)`; idempotent.

    Deliberately no `AttentionMaskInterface` entry: for an implementation without one, every
    `create_*_mask` of transformers returns None at once (masking_utils `_preprocess_mask_arguments`,
    "custom attention without equivalent mask creation"). Registering even a None-returning mask
    function would make it scan position_ids for packed sequences every step, a host sync on GPU.
    """
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    return ATTN_IMPLEMENTATION
