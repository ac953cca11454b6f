"""Per-slot sampling state kept on the device between steps (vLLM v1's InputBatch idea).

Each request the worker holds gets a slot when it is added: its parameters are written once into
device tensors, and a request with penalties also gets a row of prompt-presence mask and output
counts, built from its prompt and the outputs it already has (they matter after preemption or
failover) and then updated with each sampled token. A step gathers its rows with one index tensor
(`prepare`); the host keeps only what decides which paths run (greedy, top-k, top-p, logprobs).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from common.protocol import SamplingParams
from gpu_worker.runner.host_copies import PinnedRing
from gpu_worker.runner.sample.seeded_uniform import mix64

# Columns of the per-slot parameter tables.
TEMPERATURE, TOP_P, MIN_P, REPETITION, FREQUENCY, PRESENCE = range(6)
TOP_K, SEED, SEEDED, OUTPUT_INDEX, MIN_TOKENS = range(5)

# How a random row is drawn: without a sort, through topk, or through a full sort (top-p).
GREEDY, PLAIN, TOP_K_PATH, TOP_P_PATH = range(4)

_MASK64 = (1 << 64) - 1


@dataclass(slots=True, frozen=True)
class _SlotInfo:
    """What the host needs to know about a slot to pick a step's paths (no device reads)."""

    path: int
    top_k: int  # 0 when off
    min_p: bool
    penalty_row: int  # -1 without penalties
    logprobs: int | None
    bias: bool  # sets logit_bias
    min_tokens: int  # 0 without stop ids to mask


@dataclass(slots=True)
class SamplingBatch:
    """The rows of one step, in logits order; index tensors are views of one host-to-device copy."""

    num_rows: int
    slot_list: list[int]
    floats: torch.Tensor  # [N, 6] per-row float parameters (columns above)
    ints: torch.Tensor  # [N, 5] per-row integer parameters
    slots: torch.Tensor  # [N]
    # Per path (GREEDY, PLAIN, TOP_K_PATH, TOP_P_PATH): how many rows take it, and which ones
    # (None when it is every row, which saves an index).
    path_sizes: list[int]
    path_rows: list[torch.Tensor | None]
    max_top_k: int  # largest top_k among top_k_rows (topk needs it on the host)
    plain_min_p: bool  # some plain row sets min_p
    penalty_rows: torch.Tensor | None  # rows with penalties, and their rows in the penalty tables
    penalty_table_rows: torch.Tensor | None
    penalty_row_list: list[int]  # penalty_rows on the host
    logprob_rows: torch.Tensor | None
    logprob_row_list: list[int]  # the same rows on the host
    logprob_ks: list[int]  # per logprob row, how many most likely tokens it asked for
    # Gathered only when some row of the step needs them.
    bias_ids: torch.Tensor | None  # [N, W]
    bias_values: torch.Tensor | None
    stop_ids: torch.Tensor | None  # [N, W]
    prompt_mask: torch.Tensor | None  # [P, V] for penalty_rows
    output_counts: torch.Tensor | None

    @property
    def any_bias(self) -> bool:
        return self.bias_ids is not None

    @property
    def any_min_tokens(self) -> bool:
        return self.stop_ids is not None


class SamplingState:
    def __init__(
        self,
        vocab_size: int,
        device: torch.device,
        eos_token_ids: Collection[int] = (),
        capacity: int = 16,
    ) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self._eos_token_ids = sorted(set(eos_token_ids))  # masked by min_tokens
        self._slots: dict[str, int] = {}
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self._info: list[_SlotInfo | None] = [None] * capacity
        # Outputs per slot, also kept on the host: the min_tokens mask stops once every row is past it.
        self._num_outputs = [0] * capacity
        self.floats = torch.zeros(capacity, 6, device=device)
        self.ints = torch.zeros(capacity, 5, dtype=torch.long, device=device)
        # logit_bias and min_tokens stop ids as padded rows, widened when a request needs more.
        self.bias_ids = torch.zeros(capacity, 0, dtype=torch.long, device=device)
        self.bias_values = torch.zeros(capacity, 0, device=device)
        self.stop_ids = torch.zeros(capacity, 0, dtype=torch.long, device=device)
        # Penalty rows only for requests that set a penalty.
        self.prompt_mask = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)
        self.output_counts = torch.zeros(0, vocab_size, device=device)
        self._free_penalty_rows: list[int] = []
        # Staging for the step's index tensor: pinned, so its copy does not wait on the host, and
        # double-buffered behind events, so a step never overwrites a buffer still being copied.
        self._staging = PinnedRing(torch.long, device)

    # ---- add / remove ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slots)

    def add(
        self,
        req_id: str,
        params: SamplingParams,
        prompt_token_ids: Sequence[int],
        output_token_ids: Sequence[int],
    ) -> None:
        """Write a request's parameters into a slot (replacing any earlier state under `req_id`);
        the next token it samples has output index len(output_token_ids)."""
        self.remove(req_id)
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self._slots[req_id] = slot
        top_k = params.top_k if 0 < params.top_k < self.vocab_size else 0
        greedy = params.greedy
        if greedy:
            path = GREEDY
        elif params.top_p < 1.0:
            path = TOP_P_PATH
        else:
            path = TOP_K_PATH if top_k else PLAIN
        self.floats[slot] = self._upload(
            [
                0.0 if greedy else params.temperature,
                params.top_p,
                params.min_p,
                params.repetition_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            ],
            torch.float32,
        )
        seed = 0 if params.seed is None else _signed64(mix64(params.seed & _MASK64))
        stops = self._min_tokens_stops(params)
        self._num_outputs[slot] = len(output_token_ids)
        self.ints[slot] = self._upload(
            [
                top_k or self.vocab_size,
                seed,
                params.seed is not None,
                len(output_token_ids),
                params.min_tokens if stops else 0,
            ],
            torch.long,
        )
        if params.logit_bias:
            ids, values = zip(*params.logit_bias.items(), strict=True)
            self._write_padded_bias(slot, list(ids), list(values))
        if stops:
            self._write_stops(slot, stops)
        penalty_row = -1
        if params.has_penalties:
            penalty_row = self._add_penalties(prompt_token_ids, output_token_ids)
        self._info[slot] = _SlotInfo(
            path=path,
            top_k=top_k,
            min_p=params.min_p > 0.0,
            penalty_row=penalty_row,
            logprobs=params.logprobs,
            bias=bool(params.logit_bias),
            min_tokens=params.min_tokens if stops else 0,
        )

    def remove(self, req_id: str) -> None:
        """Free the slot of `req_id`; nothing to do if it holds none."""
        slot = self._slots.pop(req_id, None)
        if slot is None:
            return
        info = self._info[slot]
        if info is not None and info.penalty_row >= 0:
            self._free_penalty_rows.append(info.penalty_row)
        if info is not None and info.bias:
            self.bias_values[slot].zero_()  # the bias of a step gathers every row, this one included
        self._info[slot] = None
        self._free.append(slot)

    def clear(self) -> None:
        for req_id in list(self._slots):
            self.remove(req_id)

    def penalty_state(self, req_id: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(prompt presence mask [V], output counts [V]) of a request with penalties, else None."""
        info = self._info[self._slots[req_id]]
        if info is None or info.penalty_row < 0:
            return None
        return self.prompt_mask[info.penalty_row], self.output_counts[info.penalty_row]

    def _min_tokens_stops(self, params: SamplingParams) -> list[int]:
        if params.min_tokens <= 0:
            return []
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops.update(self._eos_token_ids)
        return sorted(stops)

    def _write_padded_bias(self, slot: int, ids: list[int], values: list[float]) -> None:
        width = len(ids)
        if width > self.bias_ids.shape[1]:
            extra = width - self.bias_ids.shape[1]
            self.bias_ids = torch.nn.functional.pad(self.bias_ids, (0, extra))
            self.bias_values = torch.nn.functional.pad(self.bias_values, (0, extra))
        # Padding adds 0.0 to token 0: harmless.
        self.bias_ids[slot].zero_()
        self.bias_values[slot].zero_()
        self.bias_ids[slot, :width] = self._upload(ids, torch.long)
        self.bias_values[slot, :width] = self._upload(values, torch.float32)

    def _write_stops(self, slot: int, stops: list[int]) -> None:
        width = len(stops)
        if width > self.stop_ids.shape[1]:
            # Padding repeats each row's first id: masking it twice is masking it once.
            old = self.stop_ids.shape[1]
            rows = self.stop_ids.shape[0]
            first = (
                self.stop_ids[:, :1] if old else torch.zeros(rows, 1, dtype=torch.long, device=self.device)
            )
            self.stop_ids = torch.cat([self.stop_ids, first.expand(-1, width - old)], dim=1)
        row = stops + [stops[0]] * (self.stop_ids.shape[1] - width)
        self.stop_ids[slot] = self._upload(row, torch.long)

    def _add_penalties(self, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]) -> int:
        if not self._free_penalty_rows:
            rows = self.prompt_mask.shape[0]
            grown = max(4, rows * 2)
            self.prompt_mask = _grow_rows(self.prompt_mask, grown)
            self.output_counts = _grow_rows(self.output_counts, grown)
            self._free_penalty_rows = list(range(grown - 1, rows - 1, -1))
        row = self._free_penalty_rows.pop()
        outputs = self._upload(list(output_token_ids), torch.long)
        self.prompt_mask[row].zero_().index_fill_(0, self._upload(list(prompt_token_ids), torch.long), True)
        self.output_counts[row].zero_().index_add_(0, outputs, torch.ones(outputs.shape, device=self.device))
        return row

    def _grow(self) -> None:
        old = self.floats.shape[0]
        new = old * 2
        self.floats = _grow_rows(self.floats, new)
        self.ints = _grow_rows(self.ints, new)
        self.bias_ids = _grow_rows(self.bias_ids, new)
        self.bias_values = _grow_rows(self.bias_values, new)
        self.stop_ids = _grow_rows(self.stop_ids, new)
        self._info += [None] * (new - old)
        self._num_outputs += [0] * (new - old)
        self._free = list(range(new - 1, old - 1, -1)) + self._free

    # ---- one step -------------------------------------------------------------------------------

    def prepare(self, req_ids: Sequence[str]) -> SamplingBatch:
        """The parameters of the rows that sample this step, `req_ids` in logits order."""
        slots = [self._slots[r] for r in req_ids]
        infos = [self._info[s] for s in slots]
        paths: list[list[int]] = [[], [], [], []]
        penalty_rows: list[int] = []
        table_rows: list[int] = []
        logprob_rows: list[int] = []
        logprob_ks: list[int] = []
        max_top_k = 0
        plain_min_p = any_bias = any_min_tokens = False
        for row, (slot, info) in enumerate(zip(slots, infos, strict=True)):
            assert info is not None
            any_bias = any_bias or info.bias
            any_min_tokens = any_min_tokens or info.min_tokens > self._num_outputs[slot]
            paths[info.path].append(row)
            if info.path == TOP_K_PATH:
                max_top_k = max(max_top_k, info.top_k)
            elif info.path == PLAIN:
                plain_min_p = plain_min_p or info.min_p
            if info.penalty_row >= 0:
                penalty_rows.append(row)
                table_rows.append(info.penalty_row)
            if info.logprobs is not None:
                logprob_rows.append(row)
                logprob_ks.append(info.logprobs)
        num_rows = len(slots)
        groups = [slots, *paths, penalty_rows, table_rows, logprob_rows]
        index = self._staging.to_device([i for group in groups for i in group])
        views: list[torch.Tensor | None] = []
        offset = 0
        for group in groups:
            views.append(index[offset : offset + len(group)] if group else None)
            offset += len(group)
        slot_index = index[:num_rows]
        table_index = views[6]
        return SamplingBatch(
            num_rows=num_rows,
            slot_list=slots,
            floats=self.floats.index_select(0, slot_index),
            ints=self.ints.index_select(0, slot_index),
            slots=slot_index,
            path_sizes=[len(p) for p in paths],
            path_rows=[None if len(p) == num_rows else v for p, v in zip(paths, views[1:5], strict=True)],
            max_top_k=max_top_k,
            plain_min_p=plain_min_p,
            penalty_rows=views[5],
            penalty_table_rows=views[6],
            penalty_row_list=penalty_rows,
            logprob_rows=views[7],
            logprob_row_list=logprob_rows,
            logprob_ks=logprob_ks,
            bias_ids=self.bias_ids.index_select(0, slot_index) if any_bias else None,
            bias_values=self.bias_values.index_select(0, slot_index) if any_bias else None,
            stop_ids=self.stop_ids.index_select(0, slot_index) if any_min_tokens else None,
            prompt_mask=None if table_index is None else self.prompt_mask.index_select(0, table_index),
            output_counts=None if table_index is None else self.output_counts.index_select(0, table_index),
        )

    def record(self, batch: SamplingBatch, tokens: torch.Tensor) -> None:
        """After a step sampled `tokens` [N]: advance output indices and the penalty counts."""
        for slot in batch.slot_list:
            self._num_outputs[slot] += 1
        self.ints[:, OUTPUT_INDEX].index_add_(0, batch.slots, torch.ones_like(batch.slots))
        if batch.penalty_rows is not None and batch.penalty_table_rows is not None:
            counted = tokens.index_select(0, batch.penalty_rows)
            self.output_counts.index_put_(
                (batch.penalty_table_rows, counted),
                torch.ones(counted.shape, device=self.device),
                accumulate=True,
            )

    def count_run(self, req_id: str, accepted: Sequence[int], sampled: int, final: int) -> None:
        """A drafting request's step output its `accepted` drafts, then `final`, where `record` saw
        one output, `sampled` (the token of its row after the drafts, which `final` replaces when a
        draft was rejected): its output index moves past the drafts and its penalty counts take the
        run instead of `sampled`."""
        slot = self._slots[req_id]
        self._num_outputs[slot] += len(accepted)
        self.ints[slot, OUTPUT_INDEX] += len(accepted)
        info = self._info[slot]
        assert info is not None
        if info.penalty_row >= 0 and (accepted or final != sampled):
            tokens = [*accepted, final, sampled]
            counts = torch.tensor([1.0] * (len(accepted) + 1) + [-1.0], device=self.device)
            index = torch.tensor(tokens, dtype=torch.long, device=self.device)
            self.output_counts[info.penalty_row].index_add_(0, index, counts)

    def _upload(self, values: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
        """A small host list on the device; on CUDA through pinned memory, so the copy is queued on
        the stream instead of waiting for it to drain (the caching host allocator keeps the block
        until the copy is done)."""
        host = torch.tensor(values, dtype=dtype)
        return host if self.device.type == "cpu" else host.pin_memory().to(self.device, non_blocking=True)


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _grow_rows(table: torch.Tensor, rows: int) -> torch.Tensor:
    extra = torch.zeros(rows - table.shape[0], *table.shape[1:], dtype=table.dtype, device=table.device)
    return torch.cat([table, extra])
