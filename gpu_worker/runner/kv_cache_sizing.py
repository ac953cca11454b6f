"""The runner's KV-cache pool and the attention backends that read it: a temporary pool for the
profiling step, then the real one sized by what that step leaves of the device's memory."""

from __future__ import annotations

from typing import Any, Literal, Protocol

import torch

from gpu_worker.runner.attention.backend import AttentionBackend
from gpu_worker.runner.attention.selector import make_attention_backend
from gpu_worker.runner.kv_cache import KVCache
from gpu_worker.runner.load_model import (
    Model,
    allocate_kv_cache,
    kv_shape,
    resolve_max_model_len,
    resolve_num_blocks,
)
from gpu_worker.runner.profile import (
    MemorySnapshot,
    ProfiledRunner,
    ProfileStep,
    kv_cache_budget,
    run_profile_step,
)
from gpu_worker.runner.spec_decode.draft_model import DraftModelProposer
from gpu_worker.settings import WorkerSettings


class KVSizedRunner(ProfiledRunner, Protocol):
    """What the pool's sizing uses of the ModelRunner (named here rather than imported:
    model_runner.py imports this file)."""

    kv_cache: KVCache
    attn_backend: AttentionBackend[Any]
    mask_backend: AttentionBackend[Any]
    num_blocks: int
    max_model_len: int

    @property
    def model(self) -> Model: ...
    @property
    def block_size(self) -> int: ...
    @property
    def draft_model(self) -> DraftModelProposer | None: ...
    @property
    def _attention_backend_name(self) -> Literal["torch", "triton"]: ...
    @property
    def _group_decodes(self) -> bool: ...
    @property
    def _cascade_attention(self) -> bool: ...
    @property
    def _kv_cache_dtype(self) -> torch.dtype: ...


def use_kv_cache(runner: KVSizedRunner, num_blocks: int) -> None:
    """Allocate a pool of `num_blocks` and the attention backend that reads it."""
    runner.kv_cache = allocate_kv_cache(
        kv_shape(runner.model.config), num_blocks, runner.block_size, runner._kv_cache_dtype, runner.device
    )
    runner.attn_backend = make_attention_backend(
        runner._attention_backend_name,
        runner.kv_cache,
        runner._group_decodes,
        runner._cascade_attention,
        runner.model.dtype,
    )
    # The backend of steps whose queries see past themselves (key limits): the torch one reads them.
    runner.mask_backend = runner.attn_backend
    if runner.attn_backend.name != "torch":
        runner.mask_backend = make_attention_backend(
            "torch", runner.kv_cache, runner._group_decodes, False, runner.model.dtype
        )


def size_kv_cache(
    runner: KVSizedRunner, settings: WorkerSettings, step: ProfileStep, start: MemorySnapshot | None
) -> None:
    """Run the profiling step in the temporary pool, then give the real pool what it leaves."""
    result = run_profile_step(runner, step)
    del runner.kv_cache, runner.attn_backend, runner.mask_backend  # freed before measuring what is left
    budget = kv_cache_budget(settings, runner.device, start, result)
    shapes = [kv_shape(runner.model.config)]
    if runner.draft_model is not None:
        shapes.append(runner.draft_model.kv_shape)  # a block of each pool per block of the budget
    runner.num_blocks = resolve_num_blocks(settings, shapes, runner._kv_cache_dtype, budget)
    runner.max_model_len = resolve_max_model_len(settings, runner.model.config, runner.num_blocks)
    use_kv_cache(runner, runner.num_blocks)
    if runner.draft_model is not None:
        runner.draft_model.use_kv_cache(runner.num_blocks)
