"""Which attention backend a runner uses: the one place that builds it from its name.

The name comes from the settings (`WORKER_ATTENTION_BACKEND`; auto: triton on cuda, torch on cpu,
gpu_worker/settings.py). Kept apart from the interface (backend.py), which the backends import: choosing
imports them, so the interface cannot.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.runner.attention.backend import AttentionBackend, BackendName
from gpu_worker.runner.attention.torch_attn import TorchAttentionBackend
from gpu_worker.runner.kv_cache import KVCache


def make_attention_backend(
    name: BackendName,
    kv_cache: KVCache,
    group_decodes: bool,
    cascade: bool = False,
    dtype: torch.dtype | None = None,
) -> AttentionBackend[Any]:
    """The backend called `name` over `kv_cache`, for queries of `dtype` (default: the pool's);
    Triton is imported only when asked for."""
    if name == "triton":
        from gpu_worker.runner.attention.triton_attn import TritonAttentionBackend

        return TritonAttentionBackend(kv_cache)
    return TorchAttentionBackend(kv_cache, group_decodes=group_decodes, cascade=cascade, dtype=dtype)
