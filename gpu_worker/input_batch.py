"""Turns the requests scheduled in one step into one flattened ragged batch plus attention metadata."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpu_worker.attention import AttentionMetadata, PrefillChunk
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


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def build_input_batch(
    requests: Sequence[ScheduledRequest], kv_cache: KVCache, device: torch.device
) -> InputBatch:
    """Decodes (query length 1) go first so attention serves them with one batched gather."""
    block_size = kv_cache.block_size
    decodes = [r for r in requests if r.num_tokens == 1]
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

    decode_tables: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None
    if decodes:
        context_lens = [r.state.num_computed_tokens + 1 for r in decodes]
        num_table_blocks = _ceil_div(max(context_lens), block_size)
        # Padding with block 0 is harmless: the mask hides every position past the context length.
        tables = [
            r.state.block_ids[: _ceil_div(n, block_size)]
            + [0] * (num_table_blocks - _ceil_div(n, block_size))
            for r, n in zip(decodes, context_lens, strict=True)
        ]
        decode_tables = torch.tensor(tables, dtype=torch.long).to(device)
        lens = torch.tensor(context_lens).unsqueeze(1)
        mask = torch.arange(num_table_blocks * block_size).unsqueeze(0) < lens
        decode_mask = mask.view(len(decodes), 1, 1, -1).to(device)

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
        num_decode_tokens=len(decodes),
        decode_block_tables=decode_tables,
        decode_mask=decode_mask,
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
