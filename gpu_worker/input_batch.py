"""Turns the requests scheduled in one step into one flattened ragged batch plus attention metadata."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpu_worker.attention import AttentionMetadata, DecodeGroup, PrefillChunk
from gpu_worker.kv_cache import KVCache
from gpu_worker.request_state import RequestState


@dataclass(slots=True)
class ScheduledRequest:
    state: RequestState
    num_tokens: int  # tokens computed for it this step, starting at state.num_computed_tokens


@dataclass(slots=True)
class InputBatch:
    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    logits_indices: torch.Tensor  # [N] flat index of the last token of each request that samples
    sampling_reqs: list[ScheduledRequest]  # the N requests whose known tokens are all computed now
    scheduled: list[ScheduledRequest]  # every request of the step, in batch order
    attn_metadata: AttentionMetadata


# A decode joins the current group while its table has at least this share of the group's longest
# table: each group's gather reads its longest table for every member, so under a fifth of what a
# member reads is padding.
GROUP_SHARE = 0.8


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def build_input_batch(
    requests: Sequence[ScheduledRequest],
    kv_cache: KVCache,
    device: torch.device,
    group_decodes: bool = False,
) -> InputBatch:
    """Decodes (query length 1) go first, longest context first, so that attention serves them with
    one gather per group of similar lengths (one group for all when `group_decodes` is off)."""
    block_size = kv_cache.block_size
    decodes = sorted(
        (r for r in requests if r.num_tokens == 1), key=lambda r: r.state.num_computed_tokens, reverse=True
    )
    prefills = [r for r in requests if r.num_tokens > 1]
    ordered = decodes + prefills

    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    logits_indices: list[int] = []
    sampling: list[ScheduledRequest] = []
    for req in ordered:
        state, start = req.state, req.state.num_computed_tokens
        end = start + req.num_tokens
        input_ids.extend(state.token_ids[start:end])
        table = state.block_ids
        for pos in range(start, end):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        positions.extend(range(start, end))
        if end == state.num_tokens:
            logits_indices.append(len(input_ids) - 1)
            sampling.append(req)

    context_lens = [r.state.num_computed_tokens + 1 for r in decodes]
    groups = [
        _decode_group(decodes[start:end], context_lens[start:end], start, block_size, device)
        for start, end in _group_bounds(context_lens, block_size, group_decodes)
    ]

    chunks: list[PrefillChunk] = []
    offset = len(decodes)
    for req in prefills:
        start = req.state.num_computed_tokens
        context_len = start + req.num_tokens
        chunk_table = torch.tensor(
            req.state.block_ids[: _ceil_div(context_len, block_size)], dtype=torch.long
        )
        causal: torch.Tensor | None = None
        if start > 0:
            query_pos = torch.arange(start, context_len).unsqueeze(1)
            causal = (torch.arange(context_len).unsqueeze(0) <= query_pos).to(device)
        chunks.append(
            PrefillChunk(
                start=offset,
                end=offset + req.num_tokens,
                block_table=chunk_table.to(device),
                context_len=context_len,
                causal_mask=causal,
            )
        )
        offset += req.num_tokens

    metadata = AttentionMetadata(
        kv_cache=kv_cache,
        slot_mapping=torch.tensor(slots, dtype=torch.long).to(device),
        decodes=groups,
        prefills=chunks,
    )
    return InputBatch(
        input_ids=torch.tensor([input_ids], dtype=torch.long).to(device),
        position_ids=torch.tensor([positions], dtype=torch.long).to(device),
        logits_indices=torch.tensor(logits_indices, dtype=torch.long).to(device),
        sampling_reqs=sampling,
        scheduled=ordered,
        attn_metadata=metadata,
    )


def _group_bounds(context_lens: list[int], block_size: int, split: bool) -> list[tuple[int, int]]:
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


def _decode_group(
    decodes: Sequence[ScheduledRequest],
    context_lens: list[int],
    start: int,
    block_size: int,
    device: torch.device,
) -> DecodeGroup:
    num_table_blocks = _ceil_div(context_lens[0], block_size)  # the longest comes first
    # Padding with block 0 is harmless: the mask hides every position past the context length.
    tables = [
        r.state.block_ids[: _ceil_div(n, block_size)] + [0] * (num_table_blocks - _ceil_div(n, block_size))
        for r, n in zip(decodes, context_lens, strict=True)
    ]
    mask: torch.Tensor | None = None
    if context_lens[-1] < num_table_blocks * block_size:  # someone's table ends before it is full
        lens = torch.tensor(context_lens).unsqueeze(1)
        full = torch.arange(num_table_blocks * block_size).unsqueeze(0) < lens
        mask = full.view(len(decodes), 1, 1, -1).to(device)
    return DecodeGroup(
        start=start,
        end=start + len(decodes),
        block_tables=torch.tensor(tables, dtype=torch.long).to(device),
        mask=mask,
    )
