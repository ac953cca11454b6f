"""Turns the requests scheduled in one step into one flattened ragged batch plus attention metadata.

Token-level fields (slot mapping, positions) come from tensor ops over per-request values, never a
Python loop over tokens. On CUDA every field is copied from pinned host memory without blocking.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpu_worker.runner.attention.backend import AttentionBackend, AttentionContext, CommonAttentionMetadata
from gpu_worker.runner.block_table import BlockTable
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.sample.prompt_logprobs import PromptRows


@dataclass(slots=True)
class ScheduledRequest:
    state: CachedRequestState
    num_tokens: int  # tokens computed for it this step, starting at state.num_computed_tokens
    spec_token_ids: list[int] = field(default_factory=list)  # drafts computed after its known tokens

    @property
    def token_ids(self) -> list[int]:
        """Its known tokens, then this step's drafts."""
        return self.state.token_ids + self.spec_token_ids if self.spec_token_ids else self.state.token_ids

    @property
    def num_tokens_with_drafts(self) -> int:
        return self.state.num_tokens + len(self.spec_token_ids)


@dataclass(slots=True)
class InputBatch:
    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    logits_indices: torch.Tensor  # [N] flat index of the last token of each request that samples
    sampling_reqs: list[ScheduledRequest]  # the N requests whose known tokens are all computed now
    scheduled: list[ScheduledRequest]  # every request of the step, in batch order
    attn_metadata: AttentionContext
    # Prompt positions whose logits are kept too, for requests that asked for prompt logprobs.
    prompt_rows: list[PromptRows]
    prompt_indices: torch.Tensor | None  # [R] their flat indexes, None when there are none
    prompt_targets: torch.Tensor | None  # [R] the prompt token each of them predicts
    # Requests with drafts, and per draft the flat index of the token before it, whose logits verify it.
    spec_reqs: list[ScheduledRequest]
    spec_indices: torch.Tensor | None  # [D] in spec_reqs order, None when nothing drafted
    # [T] each token's LoRA slot (-1: the base model); None on a worker without LoRA.
    lora_ids: torch.Tensor | None = None

    @property
    def kept_indices(self) -> torch.Tensor:
        """The flat indexes whose logits the forward keeps: sampling rows, draft rows, prompt rows."""
        extra = [i for i in (self.spec_indices, self.prompt_indices) if i is not None]
        return torch.cat([self.logits_indices, *extra]) if extra else self.logits_indices


def build_input_batch(
    requests: Sequence[ScheduledRequest],
    backend: AttentionBackend[Any],
    device: torch.device,
    block_table: BlockTable | None = None,
    lora_slots: Mapping[str, int] | None = None,
    bidirectional_runs: Mapping[str, Sequence[tuple[int, int]]] | None = None,
) -> InputBatch:
    """Decodes (query length 1) go first, longest context first (the torch backend attends them in
    groups of similar length; kernels need only decodes first). The block ids come through
    `block_table`, the runner's, which holds its requests' rows between steps (a one-step table
    without it). `lora_slots`: on a worker with LoRA, the slot of each request that runs an adapter.
    `bidirectional_runs`: req_id -> the [start, end) runs of its prompt whose tokens see their whole
    run (Gemma 3's images), as the step's key limits."""
    block_size = backend.kv_cache.block_size
    decodes = sorted(
        (r for r in requests if r.num_tokens == 1), key=lambda r: r.state.num_computed_tokens, reverse=True
    )
    ordered = decodes + [r for r in requests if r.num_tokens > 1]

    computed = [r.state.num_computed_tokens for r in ordered]
    query_lens = [r.num_tokens for r in ordered]
    seq_lens = [c + n for c, n in zip(computed, query_lens, strict=True)]
    num_table_blocks = [-(-n // block_size) for n in seq_lens]
    input_ids = list(
        itertools.chain.from_iterable(
            r.token_ids[c:s] for r, c, s in zip(ordered, computed, seq_lens, strict=True)
        )
    )
    sampling = [r for r, s in zip(ordered, seq_lens, strict=True) if s == r.num_tokens_with_drafts]

    num_reqs, num_tokens = len(ordered), len(input_ids)
    query_lens_t = torch.tensor(query_lens, dtype=torch.int32)
    query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32)
    torch.cumsum(query_lens_t, 0, out=query_start_loc[1:])
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    table = BlockTable(num_reqs, max(num_table_blocks, default=0)) if block_table is None else block_table
    table_rows = table.sync([r.state for r in ordered])
    block_tables = table.gather(table_rows, num_table_blocks)

    # Each token's sequence, position and slot.
    token_seq = _run_of_each(query_start_loc[1:].long(), num_tokens)
    positions = (
        torch.arange(num_tokens)
        - query_start_loc[token_seq].long()
        + torch.tensor(computed, dtype=torch.long)[token_seq]
    )
    slot_mapping = (
        block_tables[token_seq, positions // block_size].long() * block_size + positions % block_size
    )
    sampled_seqs = torch.tensor(
        [s == r.num_tokens_with_drafts for r, s in zip(ordered, seq_lens, strict=True)], dtype=torch.bool
    )
    logits_indices = (query_start_loc[1:].long() - 1)[sampled_seqs]
    starts = query_start_loc.tolist()
    spec_reqs = [r for r in ordered if r.spec_token_ids]
    spec_flat = [
        i
        for r, end in zip(ordered, starts[1:], strict=True)
        if r.spec_token_ids
        for i in range(end - 1 - len(r.spec_token_ids), end - 1)
    ]
    rows, prompt_flat, targets = _prompt_rows(ordered, starts)
    key_limits = _key_limits(ordered, starts, positions, bidirectional_runs) if bidirectional_runs else None
    lora_ids = None
    if lora_slots is not None:
        slots = torch.tensor([lora_slots.get(r.state.req_id, -1) for r in ordered], dtype=torch.long)
        lora_ids = _to_device(slots[token_seq], device)

    common = CommonAttentionMetadata(
        slot_mapping=_to_device(slot_mapping, device),
        query_start_loc=_to_device(query_start_loc, device),
        seq_lens=_to_device(seq_lens_t, device),
        block_tables=_to_device(block_tables, device),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens_t,
        block_tables_cpu=block_tables,
        num_decodes=len(decodes),
        num_actual_tokens=num_tokens,
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        key_limits_cpu=key_limits,
    )
    return InputBatch(
        input_ids=_to_device(torch.tensor([input_ids], dtype=torch.long), device),
        position_ids=_to_device(positions.unsqueeze(0), device),
        logits_indices=_to_device(logits_indices, device),
        sampling_reqs=sampling,
        scheduled=ordered,
        attn_metadata=AttentionContext(
            backend=backend, metadata=backend.build_metadata(common), common=common
        ),
        prompt_rows=rows,
        prompt_indices=_to_device(torch.tensor(prompt_flat, dtype=torch.long), device) if rows else None,
        prompt_targets=_to_device(torch.tensor(targets, dtype=torch.long), device) if rows else None,
        spec_reqs=spec_reqs,
        spec_indices=_to_device(torch.tensor(spec_flat, dtype=torch.long), device) if spec_flat else None,
        lora_ids=lora_ids,
    )


def _prompt_rows(
    ordered: Sequence[ScheduledRequest], starts: Sequence[int]
) -> tuple[list[PromptRows], list[int], list[int]]:
    """For the requests in batch order, each starting at its flat index in `starts`: the prompt rows
    of those that asked for prompt logprobs, their flat indexes and their target token ids."""
    rows: list[PromptRows] = []
    flat: list[int] = []
    targets: list[int] = []
    for r, first in zip(ordered, starts, strict=False):
        state = r.state
        if state.prompt_logprobs is None:
            continue
        start = state.num_computed_tokens
        end = min(start + r.num_tokens, state.num_prompt_tokens - 1)
        if end <= start:
            continue
        rows.append(PromptRows(state.prompt_logprobs, start, end - start))
        flat.extend(range(first, first + end - start))
        targets.extend(state.token_ids[start + 1 : end + 1])
    return rows, flat, targets


def _key_limits(
    ordered: Sequence[ScheduledRequest],
    starts: Sequence[int],
    positions: torch.Tensor,
    runs: Mapping[str, Sequence[tuple[int, int]]],
) -> torch.Tensor | None:
    """[T]: each token's last visible key position, its run's last for tokens in a bidirectional run,
    its own for the rest; None when the step holds no such token."""
    limits = positions.clone()
    for r, first in zip(ordered, starts, strict=False):
        begin = r.state.num_computed_tokens
        for run_start, run_end in runs.get(r.state.req_id, ()):
            lo, hi = max(begin, run_start), min(begin + r.num_tokens, run_end)
            if lo < hi:
                limits[first + lo - begin : first + hi - begin] = run_end - 1
    return limits if bool((limits != positions).any()) else None


def _run_of_each(ends: torch.Tensor, num_items: int) -> torch.Tensor:
    """For items laid out in runs that end (exclusive, cumulative) at `ends`, each item's run:
    `repeat_interleave(arange(len(ends)), counts)`, whose kernel hands each run to the thread pool and
    waits on it when other processes share the cores; a search is serial at these sizes."""
    return torch.searchsorted(ends, torch.arange(num_items), right=True)


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`: on CUDA through pinned memory, so the copy does not block the host
    (the pinned staging buffer comes from torch's caching host allocator, which keeps it alive until
    the copy is done)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
