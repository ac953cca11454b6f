"""The draft model's later draft positions, run on the device from one to the next (vLLM's draft
proposer): after the first forward (the catch-up, draft_model.py), each position feeds every row the
draft the last one made (its argmax, never read on the host), one position further, its slot looked
up on the device in the row's block table; the host reads all drafts back once, at the end.

The inputs live in the static buffers of `DecodeBuffers` (graphs/decode.py), so that on CUDA the whole
loop of `num_graph_positions` positions is captured as one graph per padded batch size (rows past
the batch's: seq_len 0). Every row runs every position, whatever draft count it asked: a row past
its own stays at its last position, whose KV is written, and the host drops what it drafts there. A
captured size always replays its graph's positions, even when the rows ask fewer. Rows with nothing
to write (past their drafts, padding) write into a spare slot no request's KV is in, not slot -1:
the CPU's KV write has no mask for -1. Without capture the loop runs eagerly over the same buffers:
padded where graphs were asked for (the CPU test suite checks the padding that way), over exactly
the batch's rows otherwise (the torch backend plans from host values; a padding row has no plan).

What runs between positions (`_loop`) makes no host tensor and waits for nothing: the capture-rules
lane checks that on the CPU with fake `cuda` tensors (tests/unit/gpu_worker/spec_decode/
test_draft_loop_capture.py). With the torch backend on CUDA the backend itself reads the step's
lengths on the host each position; the triton backend, CUDA's default, reads none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from gpu_worker.runner.attention.backend import AttentionBackend
from gpu_worker.runner.graphs.capture import GraphCapture
from gpu_worker.runner.graphs.decode import DecodeBuffers, capture_sizes

if TYPE_CHECKING:
    from gpu_worker.runner.load_model import Model


class DraftDecodeLoop(DecodeBuffers):
    what = "draft batches"

    def __init__(
        self,
        model: Model,
        backend: AttentionBackend[Any],
        *,
        num_graph_positions: int,
        spare_slot: int,
        padded: bool,
        max_num_seqs: int,
        max_model_len: int,
        device: torch.device,
        capture: GraphCapture | None,
    ) -> None:
        """`num_graph_positions`: the positions a graph runs (the most drafts a request asks, less
        the catch-up's one); `spare_slot`: a slot of the pool that no request's KV is in; `padded`:
        batches run in the padded sizes graphs are captured for; `capture`: how they are captured
        (`CudaGraphCapture` on a GPU), None to run every size eagerly."""
        if capture is not None and not padded:
            raise ValueError("captured draft loops run padded batches")
        sizes = capture_sizes(max_num_seqs)
        super().__init__(model, backend, sizes, max_model_len=max_model_len, device=device, capture=capture)
        size = self.sizes[-1]
        self.padded = padded
        self.num_graph_positions = num_graph_positions
        self._block_size = backend.kv_cache.block_size
        self._spare_slot = spare_slot
        # Each row's first position (that of its first draft) and last (where its own drafts end;
        # -1 on padding rows), copied in once per proposal, before the loop.
        self.first_positions = torch.zeros(size, dtype=torch.long, device=device)
        self.last_positions = torch.full((size,), -1, dtype=torch.long, device=device)
        # Every row's drafts, the catch-up's first: what a graph leaves for the host to read.
        self.drafts = torch.zeros((size, 1 + num_graph_positions), dtype=torch.long, device=device)
        self.num_replays = 0  # proposals served by a graph (tests and stats)

    def capture(self) -> None:
        """Capture the loop once per size, where it has positions to run."""
        if self.num_graph_positions > 0:
            # Every row padding: what the captures run writes only the spare slot.
            self.last_positions.fill_(-1)
            super().capture()

    def _step(self, size: int) -> None:
        """What a graph runs: every position, its drafts in `self.drafts`."""
        self._loop(size, num_positions=self.num_graph_positions, out=self.drafts)

    def run(
        self,
        first_drafts: torch.Tensor,
        first_positions: torch.Tensor,
        last_positions: torch.Tensor,
        block_tables: torch.Tensor,
        num_positions: int,
    ) -> torch.Tensor:
        """Rows' drafts [B, 1 + n] on the device (n >= `num_positions`): `first_drafts` [B], the
        catch-up's, then those of the later positions. Row i feeds its draft at `first_positions[i]`
        and onwards, writing KV up to `last_positions[i]`, in the blocks of `block_tables` [B, width]
        (all on the device). The result is a view of a static buffer, valid until the next run."""
        num_reqs = first_drafts.shape[0]
        if num_reqs > self.sizes[-1]:
            raise ValueError(f"{num_reqs} drafting requests, more than the {self.sizes[-1]} the loop holds")
        size = self.padded_size(num_reqs) if self.padded else num_reqs
        self.first_positions[:num_reqs].copy_(first_positions)
        self.first_positions[num_reqs:size].zero_()
        self.last_positions[:num_reqs].copy_(last_positions)
        self.last_positions[num_reqs:size].fill_(-1)  # padding rows: no position of their own
        self.block_tables[:num_reqs, : block_tables.shape[1]].copy_(block_tables)
        self.input_ids[0, :num_reqs].copy_(first_drafts)
        graph = self._graphs.get(size)
        if graph is not None and num_positions <= self.num_graph_positions:
            self.drafts[:num_reqs, 0].copy_(first_drafts)
            self.num_replays += 1
            graph.replay()
            return self.drafts[:num_reqs]
        out = self.drafts
        if num_positions > self.num_graph_positions:  # more than any request asks of a worker
            out = torch.empty((size, 1 + num_positions), dtype=torch.long, device=self.drafts.device)
        out[:num_reqs, 0].copy_(first_drafts)
        self._loop(size, num_positions=num_positions, out=out)
        return out[:num_reqs, : 1 + num_positions]

    def _loop(self, size: int, *, num_positions: int, out: torch.Tensor) -> None:
        """`num_positions` decode steps over the first `size` rows, each fed the last one's argmax;
        step j's drafts land in `out[:size, j]`."""
        first, last = self.first_positions[:size], self.last_positions[:size]
        for j in range(1, num_positions + 1):
            position = first + (j - 1)
            # A row past its own drafts stays at its last position (its KV written), writing nothing
            # that is read: into the spare slot, as padding rows do.
            held = torch.minimum(position, last).clamp_(min=0)
            block = self.block_tables[:size].gather(1, (held // self._block_size).unsqueeze(1)).squeeze(1)
            slot = block * self._block_size + held % self._block_size
            self.position_ids[0, :size].copy_(held)
            self.slot_mapping[:size].copy_(torch.where(position <= last, slot, self._spare_slot))
            self.seq_lens[:size].copy_(torch.where(last >= 0, held + 1, 0))
            drafts = self.decode(size).max(dim=-1).indices
            self.input_ids[0, :size].copy_(drafts)
            out[:size, j].copy_(drafts)
