"""The Triton attention backend (the CUDA default): K/V read through block tables in place.

Per layer and step: one KV-write launch for all tokens, then one launch of the decode kernel
(gpu_worker/kernels/triton/paged_decode.py) for all decodes, split over long contexts (and its merge),
and one of the attention kernel (gpu_worker/kernels/triton/paged_attention.py) for all prefill
chunks, whatever their lengths; no gather copy, no Python loop over sequences; a layer's window, softcapping
and sinks are the kernels' arguments. Its metadata is the common metadata itself (fixed-shape tensors
plus three ints), which is what CUDA graphs need: padding rows are seq_len 0 and slot -1.
"""

from __future__ import annotations

import torch

from gpu_worker.kernels.triton.kv_write import kv_write
from gpu_worker.kernels.triton.paged_attention import paged_attention
from gpu_worker.kernels.triton.paged_decode import DecodeScratch, paged_decode
from gpu_worker.kernels.triton.paged_tile import KernelVariant, PagedBatch
from gpu_worker.runner.attention.backend import AttentionBackend, CommonAttentionMetadata
from gpu_worker.runner.attention.variant import PLAIN, AttentionVariant
from gpu_worker.runner.kv_cache import KVCache


class TritonAttentionBackend(AttentionBackend[CommonAttentionMetadata]):
    name = "triton"

    def __init__(self, kv_cache: KVCache) -> None:
        block_size = kv_cache.block_size
        if block_size & (block_size - 1):
            # Kernels split positions into block and offset with shifts and masks.
            raise ValueError(
                f"the triton attention backend needs a power-of-two block size, not {block_size}: "
                "set WORKER_BLOCK_SIZE (e.g. 16) or WORKER_ATTENTION_BACKEND=torch"
            )
        if not kv_cache.k_pools[0].is_contiguous():
            raise ValueError("the triton attention backend needs contiguous KV pools")
        super().__init__(kv_cache)
        self.scratch = DecodeScratch()  # split decodes' partial results, reused by every layer

    def build_metadata(self, common: CommonAttentionMetadata) -> CommonAttentionMetadata:
        return common

    def forward(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        metadata: CommonAttentionMetadata,
        scale: float,
        variant: AttentionVariant = PLAIN,
    ) -> torch.Tensor:
        k_cache, v_cache = self.kv_cache.k_pools[layer], self.kv_cache.v_pools[layer]
        # Rounded by torch into a narrower pool (WORKER_KV_CACHE_DTYPE), as the torch backend rounds:
        # the kernel only copies.
        key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
        kv_write(key, value, k_cache, v_cache, metadata.slot_mapping)
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)  # [T, H, D] contiguous
        num_decodes, num_reqs = metadata.num_decodes, metadata.num_reqs
        batch = PagedBatch(
            out, query, k_cache, v_cache, metadata.block_tables, metadata.seq_lens, metadata.query_start_loc
        )
        kernel_variant = KernelVariant.of(variant.window, variant.softcap, variant.sinks)
        # The decodes (one-token chunks, first in the batch), split over their contexts as the step's
        # host-known longest context asks (a CUDA graph's: the longest the worker admits).
        paged_decode(batch, num_decodes, metadata.max_seq_len, scale, self.scratch, kernel_variant)
        # Then the prefill chunks, whatever their lengths: one launch.
        paged_attention(
            batch, num_decodes, num_reqs - num_decodes, metadata.max_query_len, scale, kernel_variant
        )
        return out
