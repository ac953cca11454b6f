"""The attention-backend interface and the step metadata every backend shares.

`CommonAttentionMetadata` is built once per step by input_batch (vLLM's names and layout); each backend
derives what else it needs from it once per step (`build_metadata`), and every layer then calls
`forward` with that. The layers reach the backend through `AttentionContext`, passed down as the
`attn_metadata` forward kwarg (see transformers_interface.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

import torch

from gpu_worker.runner.attention.variant import PLAIN, AttentionVariant
from gpu_worker.runner.kv_cache import KVCache

BackendName = Literal["torch", "triton"]


@dataclass(slots=True)
class CommonAttentionMetadata:
    """One step's ragged batch of B sequences and T tokens; decodes (one query token) come first.

    Device tensors are on the model's device; the `_cpu` copies are the same values on the host, for
    backends that plan their work in Python (the torch backend's decode groups)."""

    slot_mapping: torch.Tensor  # [T] int64: flat pool slot (block * block_size + offset) of each token
    query_start_loc: torch.Tensor  # [B + 1] int32: sequence i's tokens are [qsl[i], qsl[i + 1])
    seq_lens: torch.Tensor  # [B] int32: context length of each sequence, this step's tokens included
    block_tables: torch.Tensor  # [B, max_num_blocks] int32, rows padded with block 0
    query_start_loc_cpu: torch.Tensor  # host copies of the above
    seq_lens_cpu: torch.Tensor
    block_tables_cpu: torch.Tensor
    num_decodes: int  # sequences 0 .. num_decodes - 1 have one query token each (tokens 0 .. nd - 1)
    num_actual_tokens: int  # T
    max_query_len: int
    max_seq_len: int
    # [T] host int64: the last key position each query sees, where some see past themselves (Gemma 3's
    # image tokens see their whole image); None: causal. Only the torch backend reads it (the runner
    # hands such steps to it).
    key_limits_cpu: torch.Tensor | None = None

    @property
    def num_reqs(self) -> int:
        return int(self.seq_lens.shape[0])


M = TypeVar("M")


class AttentionBackend(ABC, Generic[M]):
    """Writes a step's K/V into the paged pool and attends each query over its sequence's context."""

    name: ClassVar[BackendName]

    def __init__(self, kv_cache: KVCache) -> None:
        self.kv_cache = kv_cache

    @abstractmethod
    def build_metadata(self, common: CommonAttentionMetadata) -> M:
        """Once per step: the backend's own metadata, shared by all layers."""

    @abstractmethod
    def forward(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        metadata: M,
        scale: float,
        variant: AttentionVariant = PLAIN,
    ) -> torch.Tensor:
        """query [T, heads, head_dim], key/value [T, kv_heads, head_dim] (after RoPE, last dim
        contiguous) -> output [T, heads, head_dim]; stores key/value at the step's slots first.
        `variant`: the layer's window, softcapping and sinks (variant.py)."""

    def begin_step(self, metadata: M, common: CommonAttentionMetadata) -> None:
        """Before a step's forward: hand the step to an attention op that is not this object's
        `forward` (the CPU's C++ op, torch_attn.py). Nothing by default."""

    def end_step(self) -> None:
        """After the step's forward (raised or not): undo `begin_step`."""


@dataclass(slots=True)
class AttentionContext:
    """What every attention layer of one step receives: the backend and its metadata for the step."""

    backend: AttentionBackend[Any]
    metadata: Any  # what backend.build_metadata returned
    common: CommonAttentionMetadata
