"""The paged pool's gather (gpu_worker/runner/kv_cache.py): whole blocks in table order, widened for a reader
of a wider dtype than the pool's, into workspaces reused from step to step."""

from __future__ import annotations

import torch

from harness.gpu_worker.paged_steps import pool


def test_a_narrow_pool_is_gathered_widened_into_a_reused_workspace() -> None:
    cache = pool(8, 4, 2, 16, torch.bfloat16)
    for p in (*cache.k_pools, *cache.v_pools):
        p.copy_(torch.randn(p.shape))
    tables = torch.tensor([[5, 2, 7], [1, 0, 0]])
    k, v = cache.gather(0, tables, torch.float32)
    assert k.dtype == v.dtype == torch.float32 and k.shape == (2, 12, 2, 16)
    assert torch.equal(k, cache.k_pools[0][tables.reshape(-1)].float().view(2, 12, 2, 16))
    assert torch.equal(v, cache.v_pools[0][tables.reshape(-1)].float().view(2, 12, 2, 16))
    again, _ = cache.gather(0, tables[:1], torch.float32)
    assert again.data_ptr() == k.data_ptr()  # the same float32 workspace, not a fresh copy
    same, _ = cache.gather(0, tables, torch.bfloat16)
    assert same.dtype == torch.bfloat16 and torch.equal(same.float(), k)
