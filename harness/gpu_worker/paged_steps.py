"""Random paged-attention steps for backend tests: a KV pool holding earlier context under shuffled,
non-contiguous block tables, and one step's queries, keys and values."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from common.protocol import SamplingParams
from gpu_worker.runner.attention.backend import AttentionBackend, CommonAttentionMetadata
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.input_batch import ScheduledRequest, build_input_batch
from gpu_worker.runner.kv_cache import KVCache

# The kernels' device: the CPU under Triton's interpreter, a GPU when benchmarks/gpu/gpu_check.sh asks.
DEVICE = torch.device(os.environ.get("CBSERVE_TEST_DEVICE", "cpu"))


@dataclass
class PagedStep:
    common: CommonAttentionMetadata
    query: torch.Tensor  # [T, heads, head_dim]
    key: torch.Tensor  # [T, kv_heads, head_dim]
    value: torch.Tensor
    k_pool: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]: the pool before the step
    v_pool: torch.Tensor


def make_step(
    backend: AttentionBackend[object],
    seqs: list[tuple[int, int]],
    *,
    num_heads: int,
    dtype: torch.dtype,
    seed: int = 0,
) -> PagedStep:
    """`seqs`: (cached tokens, tokens this step) per sequence. Fills `backend.kv_cache` with random
    values; every sequence gets blocks drawn from a shuffled pool, so tables have holes and run backwards."""
    kv_cache = backend.kv_cache
    generator = torch.Generator().manual_seed(seed)
    block_size = kv_cache.block_size
    num_blocks, _, num_kv_heads, head_dim = kv_cache.k_pools[0].shape
    free = torch.randperm(num_blocks, generator=generator).tolist()
    requests = []
    for i, (cached, new) in enumerate(seqs):
        needed = -(-(cached + new) // block_size)
        blocks, free = free[:needed], free[needed + 1 :]  # skip one: a hole between tables
        requests.append(scheduled_request(i, blocks, cached, new))
    for pool in (*kv_cache.k_pools, *kv_cache.v_pools):
        pool.copy_(torch.randn(pool.shape, generator=generator).to(DEVICE))
    batch = build_input_batch(requests, backend, kv_cache.k_pools[0].device)
    num_tokens = batch.attn_metadata.common.num_actual_tokens

    def rand(heads: int) -> torch.Tensor:
        return torch.randn(num_tokens, heads, head_dim, generator=generator).to(DEVICE, dtype)

    return PagedStep(
        common=batch.attn_metadata.common,
        query=rand(num_heads),
        key=rand(num_kv_heads),
        value=rand(num_kv_heads),
        k_pool=kv_cache.k_pools[0].clone(),
        v_pool=kv_cache.v_pools[0].clone(),
    )


def scheduled_request(i: int, blocks: list[int], cached: int, new: int) -> ScheduledRequest:
    """Request `r{i}` holding `blocks`, with `cached` tokens computed and `new` scheduled now."""
    state = CachedRequestState(
        req_id=f"r{i}",
        token_ids=[1] * (cached + new),
        num_prompt_tokens=cached + new,
        sampling_params=SamplingParams(),
        block_ids=blocks,
        num_computed_tokens=cached,
        attempt=0,
    )
    return ScheduledRequest(state=state, num_tokens=new)


def pool(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> KVCache:
    return KVCache.allocate(
        num_layers=1,
        num_blocks=num_blocks,
        block_size=block_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device=DEVICE,
    )
