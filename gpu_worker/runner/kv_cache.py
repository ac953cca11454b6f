"""The paged KV cache: one preallocated K and V pool per layer, addressed by block and slot.

A token's slot is `block_id * block_size + offset`; the batcher owns which blocks a request holds, the
worker only writes the slots it is told to and reads them back through the request's block table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class KVCache:
    k_pools: list[torch.Tensor]  # per layer: [num_blocks, block_size, num_kv_heads, head_dim]
    v_pools: list[torch.Tensor]  # same shape as k_pools
    block_size: int
    # Reused gather outputs (K, V) by dtype (the pool's, and the reader's when it is wider), grown on
    # demand: a fresh output of tens of MB page-faults on every first write on the CPU
    # (docs/benchmarks.md).
    _workspaces: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def allocate(
        cls,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> KVCache:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # Zeroed, not empty: padded reads in batched decode are masked, but 0 * NaN from garbage
        # memory would still poison the weighted sum.
        k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        return cls(k_pools=k, v_pools=v, block_size=block_size)

    @staticmethod
    def bytes_per_block(
        *, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    @property
    def num_blocks(self) -> int:
        return int(self.k_pools[0].shape[0])

    def write(self, layer: int, slot_mapping: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store `key`/`value` ([T, num_kv_heads, head_dim]) at the flat slots `slot_mapping` ([T])."""
        k_flat = self.k_pools[layer].view(-1, *self.k_pools[layer].shape[2:])
        v_flat = self.v_pools[layer].view(-1, *self.v_pools[layer].shape[2:])
        k_flat.index_copy_(0, slot_mapping, key.to(k_flat.dtype))
        v_flat.index_copy_(0, slot_mapping, value.to(v_flat.dtype))

    def gather(
        self, layer: int, block_tables: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the blocks in `block_tables` ([B, nb]), as [B, nb * block_size, kv_heads, head_dim]
        in `dtype` (the reader's: a pool stored narrower, WORKER_KV_CACHE_DTYPE, is widened).

        The result is a view of a reused workspace: valid until the next gather.
        """
        batch, num_table_blocks = block_tables.shape
        flat = block_tables.reshape(-1)
        pool_dtype = self.k_pools[layer].dtype
        k_out, v_out = self._gather_outputs(flat.numel(), pool_dtype)
        # index_select on dim 0 copies whole blocks (memcpy per block on CPU); advanced indexing
        # (`pool[block_tables]`) copies element by element.
        torch.index_select(self.k_pools[layer], 0, flat, out=k_out)
        torch.index_select(self.v_pools[layer], 0, flat, out=v_out)
        if dtype != pool_dtype:
            k_wide, v_wide = self._gather_outputs(flat.numel(), dtype)
            k_out, v_out = k_wide.copy_(k_out), v_wide.copy_(v_out)
        length = num_table_blocks * self.block_size
        return (
            k_out.view(batch, length, *k_out.shape[2:]),
            v_out.view(batch, length, *v_out.shape[2:]),
        )

    def _gather_outputs(self, num_blocks: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `num_blocks` blocks of the `dtype` workspace, grown by at least a quarter when too
        small."""
        work = self._workspaces.get(dtype)
        if work is None or work[0].shape[0] < num_blocks:
            size = max(num_blocks, 0 if work is None else work[0].shape[0] * 5 // 4)
            pool = self.k_pools[0]
            work = (
                torch.empty((size, *pool.shape[1:]), dtype=dtype, device=pool.device),
                torch.empty((size, *pool.shape[1:]), dtype=dtype, device=pool.device),
            )
            self._workspaces[dtype] = work
        k_work, v_work = work
        return k_work[:num_blocks], v_work[:num_blocks]
