"""Cascade attention for the torch backend's decodes: a prefix several decodes share is read once.

As vLLM's cascade attention and FlashInfer's shared-prefix kernels: decodes whose block tables start
with the same blocks (a prompt the prefix cache handed to several requests, or the `n` choices of one)
attend over those blocks in one SDPA, their queries together, and each over the rest of its own table
in a second one; the two partial results are merged by their log-sum-exp. A head whose block ids run
consecutively is read in place, as a view of the pool, with no gather at all.

The CPU flash-attention kernel is called directly (`_scaled_dot_product_flash_attention_for_cpu`, what
`F.scaled_dot_product_attention` dispatches to on the CPU) because it also returns the log-sum-exp.
A layer's variant (variant.py): its window masks each decode's positions before its window
in the head and the tail alike, softcapping runs both parts in eager attention (which returns the
log-sum-exp too), and sinks scale the merged result by the share of the softmax they leave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gpu_worker.runner.attention.variant import AttentionVariant, eager_attention_lse
from gpu_worker.runner.kv_cache import KVCache

# Shorter shared heads are left to the per-decode path: an extra SDPA and merge per layer cost more
# than reading a few blocks twice.
MIN_HEAD_BLOCKS = 8


@dataclass(frozen=True, slots=True)
class SharedHead:
    """Leading blocks of one or more decodes' tables, attended once for all of them."""

    rows: list[int]  # the decodes (indices into the step's decodes) that share it
    blocks: list[int]  # block ids; every row's table starts with them

    @property
    def contiguous(self) -> bool:
        # Every block, not only the ends: freed blocks come back in any order, so a table like
        # [100, 57..62, 107] has the right first and last block and is not a run.
        first = self.blocks[0]
        return all(block == first + i for i, block in enumerate(self.blocks))


def plan_heads(
    tables: Sequence[Sequence[int]], context_lens: Sequence[int], block_size: int, min_blocks: int
) -> list[SharedHead]:
    """Heads of at least `min_blocks` blocks; each decode is in at most one.

    Decodes sharing their first `min_blocks` blocks share the longest prefix common to all of them. A
    head holds only full blocks before the one with the decode's own token, so that every decode keeps
    a non-empty remainder (its tail) to attend and merge with. A decode that shares nothing has no head.
    """
    by_start: dict[tuple[int, ...], list[int]] = {}
    for row, (table, context_len) in enumerate(zip(tables, context_lens, strict=True)):
        if (context_len - 1) // block_size >= min_blocks:
            by_start.setdefault(tuple(table[:min_blocks]), []).append(row)
    heads = []
    for rows in by_start.values():
        if len(rows) == 1:
            continue
        limit = min((context_lens[row] - 1) // block_size for row in rows)
        first = tables[rows[0]]
        length = next(
            (i for i in range(min_blocks, limit) if any(tables[row][i] != first[i] for row in rows)), limit
        )
        if length >= min_blocks:
            heads.append(SharedHead(rows=rows, blocks=list(first[:length])))
    return heads


@dataclass(slots=True)
class HeadRead:
    """A shared head as one step reads it: in place when its blocks are consecutive, else gathered."""

    rows: torch.Tensor  # [g] int64
    query_pos: torch.Tensor  # [g] position of each row's decoded token (for windows)
    first_block: int
    num_blocks: int
    block_table: torch.Tensor | None  # [1, num_blocks], None when read in place


@dataclass(slots=True)
class TailGroup:
    """Decodes whose tails (the blocks after their head) are of similar length: one gather, one SDPA."""

    rows: torch.Tensor  # [b] int64, longest tail first
    block_tables: torch.Tensor  # [b, nb] padded with block 0
    mask: torch.Tensor | None  # [b, 1, 1, nb * block_size] additive: 0 or -inf past each tail
    query_pos: torch.Tensor  # [b] position of each row's decoded token
    first_pos: torch.Tensor  # [b] position of each row's first tail key (its head's length)


@dataclass(slots=True)
class CascadeDecodes:
    num_decodes: int
    heads: list[HeadRead]
    tails: list[TailGroup]


def build_cascade(
    tables: list[list[int]],
    context_lens: list[int],
    block_size: int,
    heads: list[SharedHead],
    tail_bounds: Callable[[list[int]], list[tuple[int, int]]],
    dtype: torch.dtype,
    device: torch.device,
) -> CascadeDecodes:
    """The step's reads: each head, then every decode's tail, in the groups `tail_bounds` makes of
    the tail lengths sorted longest first (as the per-decode path groups context lengths)."""
    head_blocks = [0] * len(tables)
    reads = []
    for head in heads:
        for row in head.rows:
            head_blocks[row] = len(head.blocks)
        table = None if head.contiguous else torch.tensor([head.blocks], device=device)
        rows = torch.tensor(head.rows, device=device)
        query_pos = torch.tensor([context_lens[row] - 1 for row in head.rows], device=device)
        reads.append(HeadRead(rows, query_pos, head.blocks[0], len(head.blocks), table))
    tail_lens = [n - h * block_size for n, h in zip(context_lens, head_blocks, strict=True)]
    order = sorted(range(len(tables)), key=lambda row: -tail_lens[row])
    tails = []
    for start, end in tail_bounds([tail_lens[row] for row in order]):
        members = order[start:end]
        lens = [tail_lens[row] for row in members]
        width = -(-lens[0] // block_size)
        padded = [
            (tables[row][head_blocks[row] : head_blocks[row] + width] + [0] * width)[:width]
            for row in members
        ]
        mask = None
        if lens[-1] < width * block_size:
            hidden = torch.arange(width * block_size).unsqueeze(0) >= torch.tensor(lens).unsqueeze(1)
            mask = torch.zeros(hidden.shape, dtype=dtype).masked_fill(hidden, float("-inf"))
            mask = mask.view(len(members), 1, 1, -1).to(device)
        tables_t = torch.tensor(padded, device=device)
        query_pos = torch.tensor([context_lens[row] - 1 for row in members], device=device)
        first_pos = torch.tensor([head_blocks[row] * block_size for row in members], device=device)
        tails.append(TailGroup(torch.tensor(members, device=device), tables_t, mask, query_pos, first_pos))
    return CascadeDecodes(num_decodes=len(tables), heads=reads, tails=tails)


def _flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, KVH, M, D] over k/v [B, L, KVH, D] -> out [B, KVH, M, D], log-sum-exp [B, KVH, M]."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k.transpose(1, 2), v.transpose(1, 2), 0.0, False, attn_mask=mask, scale=scale
    )
    return out, lse


def _partial(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plain_mask: torch.Tensor | None,
    allowed: torch.Tensor | None,
    scale: float,
    variant: AttentionVariant,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One part (head or tail) of the decodes' attention with its log-sum-exp, as _flash: the flash
    kernel for plain attention (`plain_mask` additive), else eager attention with the bool `allowed`
    (sinks are left to the merge)."""
    if not _eager(variant):
        return _flash(q, k, v, plain_mask, scale)
    scores_only = AttentionVariant(softcap=variant.softcap)
    return eager_attention_lse(q, k.transpose(1, 2), v.transpose(1, 2), allowed, scale, scores_only)


def _eager(variant: AttentionVariant) -> bool:
    """Whether the parts run in eager attention: the flash kernel takes neither a window's per-row
    masks in the shared head nor softcapping."""
    return variant.window is not None or variant.softcap is not None


def _allowed(
    first_pos: torch.Tensor, num_keys: int, query_pos: torch.Tensor, window: int | None
) -> torch.Tensor:
    """[n, num_keys] bool: which keys at first_pos + 0 .. num_keys - 1 each query at `query_pos` [n]
    sees (causal, and within the window)."""
    keys = first_pos.unsqueeze(1) + torch.arange(num_keys, device=first_pos.device)
    allowed = keys <= query_pos.unsqueeze(1)
    if window is not None:
        allowed &= keys > (query_pos - window).unsqueeze(1)
    return allowed


def attend_cascade(
    kv_cache: KVCache,
    layer: int,
    plan: CascadeDecodes,
    query: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    variant: AttentionVariant,
) -> None:
    """Decode queries `query` [nd, H, D] -> `out` [nd, H, D]: heads, then tails merged with them."""
    num_decodes, num_heads, head_dim = query.shape
    kv_heads = kv_cache.k_pools[layer].shape[2]
    rep = num_heads // kv_heads  # query heads per KV head (grouped-query attention)
    head_out = query.new_zeros(num_decodes, num_heads, head_dim)
    # The flash kernel's log-sum-exp is float32 whatever the query's dtype; the merge stays in it.
    head_lse = query.new_full((num_decodes, num_heads), float("-inf"), dtype=torch.float32)
    for head in plan.heads:
        if head.block_table is None:
            end = head.first_block + head.num_blocks
            k = kv_cache.k_pools[layer][head.first_block : end].flatten(0, 1).unsqueeze(0).to(query.dtype)
            v = kv_cache.v_pools[layer][head.first_block : end].flatten(0, 1).unsqueeze(0).to(query.dtype)
        else:
            k, v = kv_cache.gather(layer, head.block_table, query.dtype)
        g = head.rows.numel()
        # One query sequence per KV head: every query of every sharing decode, no mask.
        q = query.index_select(0, head.rows).view(g, kv_heads, rep, head_dim)
        q = q.transpose(0, 1).reshape(1, kv_heads, g * rep, head_dim)
        # Under a window: row (decode i, head j) sees the head's keys inside decode i's window.
        allowed = None
        if variant.window is not None:
            allowed = _allowed(torch.zeros_like(head.query_pos), k.shape[1], head.query_pos, variant.window)
            allowed = allowed.repeat_interleave(rep, dim=0)
        o, lse = _partial(q, k, v, None, allowed, scale, variant)
        o = o.view(kv_heads, g, rep, head_dim).transpose(0, 1).reshape(g, num_heads, head_dim)
        head_out.index_copy_(0, head.rows, o)
        head_lse.index_copy_(0, head.rows, lse.view(kv_heads, g, rep).transpose(0, 1).reshape(g, num_heads))
    for tail in plan.tails:
        k, v = kv_cache.gather(layer, tail.block_tables, query.dtype)
        b = tail.rows.numel()
        q = query.index_select(0, tail.rows).view(b, kv_heads, rep, head_dim)
        allowed = None
        if _eager(variant):
            allowed = _allowed(tail.first_pos, k.shape[1], tail.query_pos, variant.window).view(b, 1, 1, -1)
        o, lse = _partial(q, k, v, tail.mask, allowed, scale, variant)
        tail_out, tail_lse = o.reshape(b, num_heads, head_dim), lse.reshape(b, num_heads)
        h_out, h_lse = head_out.index_select(0, tail.rows), head_lse.index_select(0, tail.rows)
        top = torch.maximum(h_lse, tail_lse)
        w_head, w_tail = torch.exp(h_lse - top).unsqueeze(-1), torch.exp(tail_lse - top).unsqueeze(-1)
        merged = (h_out * w_head + tail_out * w_tail) / (w_head + w_tail)
        if variant.sinks is not None:
            # Each head's sink takes exp(sink) of the softmax's denominator exp(lse) + exp(sink).
            lse_all = top + torch.log(w_head + w_tail).squeeze(-1)
            merged = merged * torch.sigmoid(lse_all - variant.sinks.float()).unsqueeze(-1)
        out.index_copy_(0, tail.rows, merged.to(out.dtype))
