"""Turns the requests scheduled in one step into one flattened ragged batch plus attention metadata.

Token-level fields (slot mapping, positions) come from numpy ops over per-request values, never a
Python loop over tokens, written into the runner's persistent buffers (step_input_buffers.py); on
CUDA each field is one non-blocking copy from pinned host memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gpu_worker.runner.attention.backend import AttentionBackend, AttentionContext, CommonAttentionMetadata
from gpu_worker.runner.block_table import BlockTable
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.sample.prompt_logprobs import PromptRows
from gpu_worker.runner.step_input_buffers import StepInputBuffers


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
    buffers: StepInputBuffers | None = None,
) -> InputBatch:
    """Decodes (query length 1) go first, longest context first (the torch backend attends them in
    groups of similar length; kernels need only decodes first). The block ids come through
    `block_table`, the runner's, which holds its requests' rows between steps (a one-step table
    without it). `lora_slots`: on a worker with LoRA, the slot of each request that runs an adapter.
    `bidirectional_runs`: req_id -> the [start, end) runs of its prompt whose tokens see their whole
    run (Gemma 3's images), as the step's key limits. `buffers`: the runner's, which the batch's
    tensors are views of until the next step (buffers of this step's size without them)."""
    block_size = backend.kv_cache.block_size
    decodes = sorted(
        (r for r in requests if r.num_tokens == 1), key=lambda r: r.state.num_computed_tokens, reverse=True
    )
    ordered = decodes + [r for r in requests if r.num_tokens > 1]

    computed = [r.state.num_computed_tokens for r in ordered]
    query_lens = [r.num_tokens for r in ordered]
    seq_lens = [c + n for c, n in zip(computed, query_lens, strict=True)]
    samples = [s == r.num_tokens_with_drafts for r, s in zip(ordered, seq_lens, strict=True)]
    sampling = [r for r, sample in zip(ordered, samples, strict=True) if sample]
    num_reqs, num_tokens = len(ordered), sum(query_lens)
    width = -(-max(seq_lens, default=0) // block_size)
    buf = StepInputBuffers(num_reqs, num_tokens, width, device) if buffers is None else buffers
    buf.begin(num_reqs, num_tokens, width)

    buf.input_ids.np[:num_tokens] = list(
        itertools.chain.from_iterable(
            r.token_ids[c:s] for r, c, s in zip(ordered, computed, seq_lens, strict=True)
        )
    )
    query_start_loc = buf.query_start_loc.np[: num_reqs + 1]
    query_start_loc[0] = 0
    np.cumsum(query_lens, out=query_start_loc[1:])
    buf.seq_lens.np[:num_reqs] = seq_lens
    table = BlockTable(num_reqs, width) if block_table is None else block_table
    table_rows = table.sync([r.state for r in ordered])
    num_table_blocks = -(-np.asarray(seq_lens, dtype=np.int64) // block_size)
    block_tables = buf.block_tables.np[: num_reqs * width].reshape(num_reqs, width)
    table.gather(table_rows, num_table_blocks, out=block_tables)

    # Each token's sequence, position and slot.
    token_seq = np.repeat(buf.arange[:num_reqs], query_lens)
    positions = buf.positions.np[:num_tokens]
    np.subtract(buf.arange[:num_tokens], query_start_loc[token_seq], out=positions)
    positions += np.asarray(computed, dtype=np.int64)[token_seq]
    slot_mapping = buf.slot_mapping.np[:num_tokens]
    np.multiply(block_tables[token_seq, positions // block_size], block_size, out=slot_mapping)
    slot_mapping += positions % block_size
    logits_indices = (query_start_loc[1:] - 1)[samples]
    buf.logits_indices.np[: len(logits_indices)] = logits_indices
    starts = query_start_loc.tolist()
    spec_reqs = [r for r in ordered if r.spec_token_ids]
    spec_flat = [
        i
        for r, end in zip(ordered, starts[1:], strict=True)
        if r.spec_token_ids
        for i in range(end - 1 - len(r.spec_token_ids), end - 1)
    ]
    rows, prompt_flat, targets = _prompt_rows(ordered, starts)
    positions_cpu = buf.positions.cpu[:num_tokens]
    key_limits = (
        _key_limits(ordered, starts, positions_cpu, bidirectional_runs) if bidirectional_runs else None
    )
    lora_ids = None
    if lora_slots is not None:
        slots = np.asarray([lora_slots.get(r.state.req_id, -1) for r in ordered], dtype=np.int64)
        buf.lora_ids.np[:num_tokens] = slots[token_seq]
        lora_ids = buf.lora_ids.copy_to_gpu(num_tokens)

    block_tables_cpu = buf.block_tables.cpu[: num_reqs * width].view(num_reqs, width)
    block_tables_gpu = buf.block_tables.copy_to_gpu(num_reqs * width).view(num_reqs, width)
    common = CommonAttentionMetadata(
        slot_mapping=buf.slot_mapping.copy_to_gpu(num_tokens),
        query_start_loc=buf.query_start_loc.copy_to_gpu(num_reqs + 1),
        seq_lens=buf.seq_lens.copy_to_gpu(num_reqs),
        block_tables=block_tables_gpu,
        query_start_loc_cpu=buf.query_start_loc.cpu[: num_reqs + 1],
        seq_lens_cpu=buf.seq_lens.cpu[:num_reqs],
        block_tables_cpu=block_tables_cpu,
        num_decodes=len(decodes),
        num_actual_tokens=num_tokens,
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        key_limits_cpu=key_limits,
    )
    batch = InputBatch(
        input_ids=buf.input_ids.copy_to_gpu(num_tokens).unsqueeze(0),
        position_ids=buf.positions.copy_to_gpu(num_tokens).unsqueeze(0),
        logits_indices=buf.logits_indices.copy_to_gpu(len(logits_indices)),
        sampling_reqs=sampling,
        scheduled=ordered,
        attn_metadata=AttentionContext(
            backend=backend, metadata=backend.build_metadata(common), common=common
        ),
        prompt_rows=rows,
        prompt_indices=buf.upload(buf.prompt_indices, prompt_flat) if rows else None,
        prompt_targets=buf.upload(buf.prompt_targets, targets) if rows else None,
        spec_reqs=spec_reqs,
        spec_indices=buf.upload(buf.spec_indices, spec_flat) if spec_flat else None,
        lora_ids=lora_ids,
    )
    buf.end()
    return batch


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
