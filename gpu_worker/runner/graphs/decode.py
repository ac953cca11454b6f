"""CUDA graphs for decode-only steps: captured once per padded batch size, replayed with the real
batch copied into static buffers.

A decode step of a small or mid-sized model is bound by kernel launches (hundreds per layer, each
dispatched by Python); a replayed graph submits them all at once. A graph holds fixed shapes and
addresses, so inputs live in static buffers sized for the largest batch: padding rows attend nothing
(seq_len 0) and write nowhere (slot -1), and every graph reads block tables as wide as the longest
sequence the worker admits. Steps with prefill chunks run eagerly, or as pieces around attention
(piecewise.py, WORKER_PIECEWISE_CUDA_GRAPHS). Only the Triton backend can be captured: the
torch backend plans its work from host values.

Without capture (`capture=None`, the CPU) the same padded buffers run eagerly: that is how the CPU
test suite checks the padding. A size whose capture fails runs eagerly the same way, with a warning.
What runs under capture (`_step`) makes no host tensor and waits for nothing: the capture-rules
lane (tests/unit/gpu_worker/test_capture_rules.py) checks that on the CPU with fake `cuda` tensors.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from gpu_worker.runner.attention.backend import AttentionBackend, AttentionContext, CommonAttentionMetadata
from gpu_worker.runner.graphs.capture import Graph, GraphCapture, Step
from gpu_worker.runner.input_batch import InputBatch

if TYPE_CHECKING:
    from gpu_worker.runner.load_model import Model

logger = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 16, up to and including `max_num_seqs`."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs]
    sizes += range(16, max_num_seqs, 16)
    return [*sizes, max_num_seqs]


class DecodeBuffers:
    """A decode step's inputs in static buffers for the largest of the padded `sizes`, the padded
    forward over them, and one graph per size of what a subclass runs over them (`_step`): the
    target's decode step (DecodeGraphs) or the draft model's decode loop (spec_decode/draft_loop.py)."""

    what = "decode batches"  # what the graphs are of, for the capture's log

    def __init__(
        self,
        model: Model,
        backend: AttentionBackend[Any],
        sizes: list[int],
        *,
        max_model_len: int,
        device: torch.device,
        capture: GraphCapture | None,
    ) -> None:
        """`sizes`: the padded batch sizes, ascending; `capture`: how graphs are captured
        (`CudaGraphCapture` on a GPU), None to run every size eagerly from the padded buffers."""
        self.model = model
        self.backend = backend
        self.sizes = sizes
        self.max_model_len = max_model_len
        size = self.sizes[-1]
        width = -(-max_model_len // backend.kv_cache.block_size)
        self.input_ids = torch.zeros((1, size), dtype=torch.long, device=device)
        self.position_ids = torch.zeros((1, size), dtype=torch.long, device=device)
        self.slot_mapping = torch.full((size,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(size, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((size, width), dtype=torch.int32, device=device)
        # Each row's LoRA slot, on a decoder with slots (padding rows: -1, the base model).
        lora = getattr(model, "lora_config", None) is not None
        self.lora_ids = torch.full((size,), -1, dtype=torch.long, device=device) if lora else None
        self._capture = capture
        self._graphs: dict[int, Graph] = {}
        self.failed: dict[int, str] = {}  # sizes whose capture failed (they run eagerly), with why

    def capture(self) -> None:
        """Capture `_step` once per size (`capture_each`): after the pool is allocated, whose
        addresses the graphs keep."""
        if self._capture is not None:
            graphs, self.failed = capture_each(self._capture, self.sizes, self._pieces, self.what)
            self._graphs = {size: graph for size, (graph,) in graphs.items()}

    def _pieces(self, size: int) -> list[Step]:
        """What a size's graph holds: `_step`, whole."""
        return [functools.partial(self._step, size)]

    def _step(self, size: int) -> None:
        """What a graph of `size` rows replays (its outputs in static buffers)."""
        raise NotImplementedError

    def padded_size(self, num_reqs: int) -> int:
        """The smallest of the sizes that holds `num_reqs` rows."""
        return next(s for s in self.sizes if s >= num_reqs)

    @property
    def captured_sizes(self) -> list[int]:
        """The batch sizes a graph replays, smallest first."""
        return sorted(self._graphs)

    def decode(self, size: int) -> torch.Tensor:
        """One decode step over the first `size` rows of the buffers: their logits [size, vocab]."""
        seq_lens, block_tables = self.seq_lens[:size], self.block_tables[:size]
        query_start_loc = self.query_start_loc[: size + 1]
        common = CommonAttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_tables=block_tables,
            # Host copies are for backends that plan on the host; the triton backend reads none.
            query_start_loc_cpu=query_start_loc,
            seq_lens_cpu=seq_lens,
            block_tables_cpu=block_tables,
            num_decodes=size,
            num_actual_tokens=size,
            max_query_len=1,
            max_seq_len=self.max_model_len,
        )
        context = AttentionContext(
            backend=self.backend, metadata=self.backend.build_metadata(common), common=common
        )
        lora = {} if self.lora_ids is None else {"lora_ids": self.lora_ids[:size]}
        outputs = self.model(
            input_ids=self.input_ids[:, :size],
            position_ids=self.position_ids[:, :size],
            use_cache=False,
            logits_to_keep=0,  # every row of a decode step samples
            attn_metadata=context,
            **lora,
        )
        logits: torch.Tensor = outputs.logits[0]
        return logits


def capture_each(
    capture: GraphCapture,
    sizes: list[int],
    pieces: Callable[[int], list[Step]],
    what: str,
    unit: str = "rows",
) -> tuple[dict[int, list[Graph]], dict[int, str]]:
    """Each size's `pieces(size)` captured in turn, one graph each, largest size first; logs time and
    memory. A size any piece of which fails to capture runs eagerly from the same buffers (one
    warning for all such sizes, naming `what` of so many `unit`): a worker that cannot capture serves
    slower, it does not die at startup. Returns each size's graphs and the sizes that failed, with why."""
    started = time.perf_counter()
    graphs: dict[int, list[Graph]] = {}
    errors: dict[int, RuntimeError] = {}
    with torch.inference_mode():
        for size in reversed(sizes):
            captured: list[Graph] = []
            for piece in pieces(size):
                # Eager, as every uncaptured step runs: an error here is the step's own, and stops us.
                capture.warm_up(piece)
                try:
                    captured.append(capture.capture(piece))
                except RuntimeError as exc:  # torch's capture errors (AcceleratorError is one too)
                    errors[size] = exc
                    break
            else:
                graphs[size] = captured
    failed = {size: str(exc) for size, exc in sorted(errors.items())}
    if errors:
        first = errors[max(errors)]
        logger.warning(
            "CUDA graph capture failed for %s of %s %s: they run eagerly (%s)",
            what,
            ", ".join(map(str, failed)),
            unit,
            first,
            exc_info=first,
        )
    logger.info(
        "captured %d CUDA graphs for %s up to %d %s in %.1f s, using %.0f MiB",
        sum(map(len, graphs.values())),
        what,
        sizes[-1],
        unit,
        time.perf_counter() - started,
        capture.memory_used() / 2**20,
    )
    return graphs, failed


class DecodeGraphs(DecodeBuffers):
    def __init__(
        self,
        model: Model,
        backend: AttentionBackend[Any],
        *,
        max_num_seqs: int,
        max_model_len: int,
        device: torch.device,
        capture: GraphCapture | None,
    ) -> None:
        if backend.name != "triton":
            raise ValueError("CUDA graphs need the triton attention backend (WORKER_ATTENTION_BACKEND)")
        sizes = capture_sizes(max_num_seqs)
        super().__init__(model, backend, sizes, max_model_len=max_model_len, device=device, capture=capture)
        # One logits buffer for every graph: each graph copies its rows here, so a graph keeps no
        # [size, vocab] output of its own alive (0.5 GB per graph for a 128k vocabulary).
        vocab_size = int(model.config.get_text_config().vocab_size)
        self.logits = torch.empty((self.sizes[-1], vocab_size), dtype=torch.float32, device=device)
        self.num_replays = 0  # decode steps served from these buffers (tests and stats)

    def can_run(self, batch: InputBatch) -> bool:
        """A decode-only step whose every row samples, small enough for the largest graph."""
        common = batch.attn_metadata.common
        return (
            common.num_reqs > 0
            and common.num_decodes == common.num_reqs
            and common.num_reqs <= self.sizes[-1]
            and len(batch.sampling_reqs) == common.num_reqs
            and not batch.prompt_rows
        )

    def run(self, batch: InputBatch) -> torch.Tensor:
        """The step's logits [B, vocab]: a view of a static buffer, valid until the next run."""
        common = batch.attn_metadata.common
        num_reqs = common.num_reqs
        size = self.padded_size(num_reqs)
        self.input_ids[:, :num_reqs].copy_(batch.input_ids)
        self.position_ids[:, :num_reqs].copy_(batch.position_ids)
        self.slot_mapping[:num_reqs].copy_(common.slot_mapping)
        self.slot_mapping[num_reqs:size].fill_(-1)
        self.seq_lens[:num_reqs].copy_(common.seq_lens)
        self.seq_lens[num_reqs:size].zero_()
        width = common.block_tables.shape[1]
        self.block_tables[:num_reqs, :width].copy_(common.block_tables)
        if self.lora_ids is not None:
            assert batch.lora_ids is not None
            self.lora_ids[:num_reqs].copy_(batch.lora_ids)
            self.lora_ids[num_reqs:size].fill_(-1)
        self.num_replays += 1
        if size in self._graphs:
            self._graphs[size].replay()
        else:
            self._step(size)
        return self.logits[:num_reqs]

    def _step(self, size: int) -> None:
        """One padded decode step of `size` rows; its logits land in `self.logits[:size]`."""
        self.logits[:size].copy_(self.decode(size))
