"""The torch attention backend (the CPU default, and the reference every other backend is tested
against): gathers each group's K/V out of the pool into a workspace and runs SDPA with masks.

Decodes are attended in groups of similar context length (one gather and one SDPA per group), and
every prefill chunk by itself; a first chunk attends over its own K/V without reading the pool. On
the CPU at float32 a plain layer's decodes, and its chunks of a few queries (a decode's drafts to
verify), read the pool directly through their block tables (gpu_worker/kernels/cpu/paged_decode.cpp)
instead of gathering a copy first; in a step without cascade the compiled forward's C++ op does a
plain layer's whole attention that way (gpu_worker/kernels/cpu/paged_attention.cpp, `begin_step`), so
that no layer enters Python. With cascade attention (the CPU default), decodes sharing leading blocks
read them once (cascade.py). A layer's variant (variant.py) adds its window to the masks (built once
per step and window; blocks wholly before a group's or chunk's window are not gathered) and computes
softcapping and sinks with eager attention, which SDPA cannot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gpu_worker.kernels import cpu as cpu_kernels
from gpu_worker.runner.attention.backend import AttentionBackend, CommonAttentionMetadata
from gpu_worker.runner.attention.cascade import (
    MIN_HEAD_BLOCKS,
    CascadeDecodes,
    attend_cascade,
    build_cascade,
    plan_heads,
)
from gpu_worker.runner.attention.variant import PLAIN, AttentionVariant, allowed_positions, attend
from gpu_worker.runner.kv_cache import KVCache

# A decode joins the current group while its table has at least this share of the group's longest
# table: each group's gather reads its longest table for every member, so under a fifth of what a
# member reads is padding.
GROUP_SHARE = 0.8
KERNEL_POOL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The most queries of a chunk the CPU kernel attends: it reads each key once for all of them, but
# computes their scores one by one, where SDPA multiplies matrices (docs/benchmarks.md).
KERNEL_MAX_QUERIES = 8


@dataclass(slots=True)
class KernelRead:
    """Some consecutive sequences of the step whose last queries the CPU kernel attends straight from
    the pool: views of the step's CommonAttentionMetadata, rows of its flattened queries."""

    block_tables: torch.Tensor  # [b, max_num_blocks] int32
    seq_lens: torch.Tensor  # [b] int32
    query_start_loc: torch.Tensor  # [b + 1] int32


@dataclass(slots=True)
class PrefillChunk:
    """One sequence's run of several query tokens (a prompt chunk) inside the flattened batch."""

    start: int  # index of its first token in the flattened batch
    end: int  # one past its last token
    block_table: torch.Tensor  # [nb] blocks covering positions 0 .. context_len - 1
    context_len: int  # tokens it attends over: already cached + this chunk
    cached: int  # tokens cached before this chunk (its first query's position)
    # [q, context_len] bool, True = may attend; None when the chunk starts at position 0 (plain causal)
    causal_mask: torch.Tensor | None
    kernel: KernelRead | None  # where the CPU kernel attends a later chunk's few queries
    # [q] host: the last key each query sees, where some see past themselves (an image attended
    # bidirectionally); None: causal.
    key_limits: torch.Tensor | None = None


@dataclass(slots=True)
class DecodeGroup:
    """Single-token queries of similar context length, attended with one gather and one SDPA."""

    start: int  # index of its first query in the flattened batch (decodes come first)
    end: int  # one past its last
    block_tables: torch.Tensor  # [b, nb] padded with block 0 (masked out)
    # [b, 1, 1, nb * block_size] bool, True below each context length; None when every table is full
    mask: torch.Tensor | None
    query_pos: torch.Tensor  # [b] host: position of each decoded token (context length - 1)
    kernel: KernelRead | None  # where the CPU kernel reads the pool
    num_keys: int  # positions the gather reads per row: table blocks * block size


@dataclass(slots=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T]
    decodes: list[DecodeGroup]  # the batch starts with its decodes, longest context first
    prefills: list[PrefillChunk]
    # Set instead of `decodes` when some decodes share a head (cascade.py).
    cascade: CascadeDecodes | None = None
    max_seq_len: int = 0
    # The C++ op (gpu_worker/kernels/cpu/paged_attention.cpp) attends the step's plain layers: the
    # kernel reads the decodes, no cascade.
    native: bool = False
    # window -> (a read per decode group, a read per prefill chunk), built when a layer first asks.
    window_reads: dict[int, tuple[list[KeyRead], list[KeyRead]]] = field(default_factory=dict)

    def reads_for(self, window: int, block_size: int) -> tuple[list[KeyRead], list[KeyRead]]:
        """What every decode group and prefill chunk reads under `window`: from the block holding its
        earliest query's first key in the window (blocks before it are never gathered), with a bool
        mask (True = may attend) over the keys from there."""
        if window not in self.window_reads:
            decodes: list[KeyRead] = []
            for g in self.decodes:
                first = max(int(g.query_pos.min()) - window + 1, 0) // block_size
                allowed = allowed_positions(g.query_pos, g.num_keys, window)[:, first * block_size :]
                decodes.append((first, allowed.view(g.end - g.start, 1, 1, -1).to(g.block_tables.device)))
            prefills: list[KeyRead] = []
            for c in self.prefills:
                # A first chunk (nothing cached) attends over its own K/V, all of which its first query reads.
                first = max(c.cached - window + 1, 0) // block_size
                query_pos = torch.arange(c.cached, c.context_len)
                allowed = allowed_positions(query_pos, c.context_len, window, c.key_limits)
                prefills.append((first, allowed[:, first * block_size :].to(c.block_table.device)))
            self.window_reads[window] = (decodes, prefills)
        return self.window_reads[window]


# What one decode group or prefill chunk reads: its first block in the table, and the mask over the
# keys from there on (None: causal, nothing hidden but the padding the plain mask hides).
KeyRead = tuple[int, torch.Tensor | None]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class TorchAttentionBackend(AttentionBackend[TorchAttentionMetadata]):
    name = "torch"

    def __init__(
        self, kv_cache: KVCache, group_decodes: bool, cascade: bool = False, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__(kv_cache)
        # Off: one group for all decodes (fewer launches, every row padded to the longest context).
        self.group_decodes = group_decodes
        # CPU only: it calls the CPU flash kernel for the log-sum-exp.
        self.cascade = cascade
        pool = kv_cache.k_pools[0]
        # The queries' (the model's); a pool stored narrower (WORKER_KV_CACHE_DTYPE) is read into it.
        self.dtype = pool.dtype if dtype is None else dtype
        self.decode_kernel = (
            pool.device.type == "cpu"
            and self.dtype == torch.float32
            and pool.dtype in KERNEL_POOL_DTYPES
            and cpu_kernels.load()
        )

    def build_metadata(self, common: CommonAttentionMetadata) -> TorchAttentionMetadata:
        block_size = self.kv_cache.block_size
        seq_lens: list[int] = common.seq_lens_cpu.tolist()
        starts: list[int] = common.query_start_loc_cpu.tolist()
        context_lens = seq_lens[: common.num_decodes]
        cascade = self._cascade(common, context_lens) if self.cascade else None
        groups = (
            []
            if cascade is not None
            else [
                self._decode_group(common, context_lens, start, end)
                for start, end in group_bounds(context_lens, block_size, self.group_decodes)
            ]
        )
        chunks = []
        device = common.block_tables.device
        for seq in range(common.num_decodes, common.num_reqs):
            start, end, context_len = starts[seq], starts[seq + 1], seq_lens[seq]
            cached = context_len - (end - start)
            causal: torch.Tensor | None = None
            limits = _past_causal(common.key_limits_cpu, start, end, cached)
            if cached > 0 or limits is not None:
                query_pos = torch.arange(cached, context_len) if limits is None else limits
                causal = (torch.arange(context_len).unsqueeze(0) <= query_pos.unsqueeze(1)).to(device)
            table = common.block_tables[seq, : _ceil_div(context_len, block_size)]
            kernel = None
            if self.decode_kernel and cached > 0 and end - start <= KERNEL_MAX_QUERIES and limits is None:
                kernel = _kernel_read(common, seq, seq + 1)
            chunks.append(PrefillChunk(start, end, table, context_len, cached, causal, kernel, limits))
        native = self.decode_kernel and cascade is None
        return TorchAttentionMetadata(
            common.slot_mapping, groups, chunks, cascade, common.max_seq_len, native
        )

    def begin_step(self, metadata: TorchAttentionMetadata, common: CommonAttentionMetadata) -> None:
        if metadata.native:
            torch.ops.cbserve_cpu.set_attention_step(
                self.kv_cache.k_pools, self.kv_cache.v_pools, common.slot_mapping, common.block_tables,
                common.seq_lens, common.query_start_loc, common.num_decodes, KERNEL_MAX_QUERIES,
            )  # fmt: skip

    def end_step(self) -> None:
        if self.decode_kernel:
            torch.ops.cbserve_cpu.clear_attention_step()

    def _cascade(self, common: CommonAttentionMetadata, context_lens: list[int]) -> CascadeDecodes | None:
        """The cascade plan of the step's decodes, None when no decode has a head."""
        block_size = self.kv_cache.block_size
        rows = common.block_tables_cpu[: common.num_decodes].tolist()
        tables = [row[: _ceil_div(n, block_size)] for row, n in zip(rows, context_lens, strict=True)]
        heads = plan_heads(tables, context_lens, block_size, MIN_HEAD_BLOCKS)
        if not heads:
            return None
        return build_cascade(
            tables,
            context_lens,
            block_size,
            heads,
            lambda lens: group_bounds(lens, block_size, self.group_decodes),
            self.dtype,
            common.block_tables.device,
        )

    def _decode_group(
        self, common: CommonAttentionMetadata, context_lens: list[int], start: int, end: int
    ) -> DecodeGroup:
        block_size = self.kv_cache.block_size
        lens = context_lens[start:end]
        num_table_blocks = _ceil_div(lens[0], block_size)  # the longest comes first
        # Rows are padded with block 0, which is harmless: the mask hides every position past the
        # context length.
        tables = common.block_tables[start:end, :num_table_blocks]
        kernel = _kernel_read(common, start, end) if self.decode_kernel else None
        mask: torch.Tensor | None = None
        if lens[-1] < num_table_blocks * block_size:  # someone's table ends before it is full
            full = torch.arange(num_table_blocks * block_size).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)
            mask = full.view(end - start, 1, 1, -1).to(common.block_tables.device)
        return DecodeGroup(
            start=start,
            end=end,
            block_tables=tables,
            mask=mask,
            query_pos=torch.tensor(lens) - 1,
            kernel=kernel,
            num_keys=num_table_blocks * block_size,
        )

    def forward(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        metadata: TorchAttentionMetadata,
        scale: float,
        variant: AttentionVariant = PLAIN,
    ) -> torch.Tensor:
        self.kv_cache.write(layer, metadata.slot_mapping, key, value)
        query = query.contiguous()  # as the CPU kernel reads it (the model's op passes it so already)
        out = torch.empty_like(query)
        variant = variant.within(metadata.max_seq_len)
        decode_reads: list[KeyRead] = [(0, group.mask) for group in metadata.decodes]
        prefill_reads: list[KeyRead] = [(0, chunk.causal_mask) for chunk in metadata.prefills]
        if variant.window is not None:
            decode_reads, prefill_reads = metadata.reads_for(variant.window, self.kv_cache.block_size)
        if metadata.cascade is not None:
            decodes = slice(0, metadata.cascade.num_decodes)
            attend_cascade(
                self.kv_cache, layer, metadata.cascade, query[decodes], scale, out[decodes], variant
            )
        plain = variant.is_plain
        for group, read in zip(metadata.decodes, decode_reads, strict=True):
            if group.kernel is not None and plain:
                self._attend_in_pool(layer, group.kernel, query, scale, out)
            else:
                q = query[group.start : group.end]
                self._decode(layer, group, read, q, scale, variant, out[group.start : group.end])
        for chunk, read in zip(metadata.prefills, prefill_reads, strict=True):
            if chunk.kernel is not None and plain:
                self._attend_in_pool(layer, chunk.kernel, query, scale, out)
            else:
                self._prefill(
                    layer, chunk, read, query, key, value, scale, variant, out[chunk.start : chunk.end]
                )
        return out

    def _decode(
        self,
        layer: int,
        group: DecodeGroup,
        read: KeyRead,
        q: torch.Tensor,
        scale: float,
        variant: AttentionVariant,
        out: torch.Tensor,
    ) -> None:
        # A group's single-token queries in one gather and one SDPA: [b, H, 1, D] over [b, KVH, L, D].
        first_block, mask = read
        k_cache, v_cache = self.kv_cache.gather(layer, group.block_tables[:, first_block:], q.dtype)
        attn = attend(q.unsqueeze(2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), mask, scale, variant)
        out.copy_(attn.squeeze(2))

    def _prefill(
        self,
        layer: int,
        chunk: PrefillChunk,
        read: KeyRead,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scale: float,
        variant: AttentionVariant,
        out: torch.Tensor,
    ) -> None:
        q = query[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
        first_block, mask = read
        if chunk.cached == 0:
            # Nothing cached before this chunk: its own K/V are the whole context, no pool read needed.
            k = key[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
            v = value[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
        else:
            # Later chunk of a prompt: read earlier chunks back through the block table, causal by position.
            table = chunk.block_table[first_block:].unsqueeze(0)
            k_cache, v_cache = self.kv_cache.gather(layer, table, q.dtype)
            num_keys = chunk.context_len - first_block * self.kv_cache.block_size
            k = k_cache[:, :num_keys].transpose(1, 2)
            v = v_cache[:, :num_keys].transpose(1, 2)
        # No mask only for a first chunk without a window: plain causal.
        attn = attend(q, k, v, mask, scale, variant, is_causal=mask is None)
        out.copy_(attn[0].transpose(0, 1))

    def _attend_in_pool(
        self, layer: int, read: KernelRead, query: torch.Tensor, scale: float, out: torch.Tensor
    ) -> None:
        """The CPU kernel's attention of `read`'s rows of `query` ([T, H, D], contiguous) over the
        pool, into the same rows of `out`."""
        torch.ops.cbserve_cpu.paged_decode_attention(
            out, query, self.kv_cache.k_pools[layer], self.kv_cache.v_pools[layer],
            read.block_tables, read.seq_lens, read.query_start_loc, scale,
        )  # fmt: skip


def _past_causal(key_limits: torch.Tensor | None, start: int, end: int, cached: int) -> torch.Tensor | None:
    """A chunk's rows of the step's key limits when some query sees past itself; None when causal."""
    if key_limits is None:
        return None
    limits = key_limits[start:end]
    return limits if bool((limits > torch.arange(cached, cached + end - start)).any()) else None


def _kernel_read(common: CommonAttentionMetadata, first: int, end: int) -> KernelRead:
    """Sequences [first, end) of the step, as the CPU kernel reads them (views: no copy per step)."""
    return KernelRead(
        common.block_tables[first:end], common.seq_lens[first:end], common.query_start_loc[first : end + 1]
    )


def group_bounds(context_lens: list[int], block_size: int, split: bool) -> list[tuple[int, int]]:
    """[start, end) of each decode group over lengths sorted longest first."""
    if not context_lens:
        return []
    if not split:
        return [(0, len(context_lens))]
    bounds = []
    start = 0
    for i, n in enumerate(context_lens[1:], start=1):
        if _ceil_div(n, block_size) < GROUP_SHARE * _ceil_div(context_lens[start], block_size):
            bounds.append((start, i))
            start = i
    bounds.append((start, len(context_lens)))
    return bounds
