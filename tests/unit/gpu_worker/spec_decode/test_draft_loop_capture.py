"""The draft model's later positions as one CUDA graph per padded batch size, checked on the fake CUDA
device (harness/gpu_worker/fake_cuda.py): the whole loop, every position of it, is captured under
the rules a capture enforces (harness/gpu_worker/capture_rules.py), so it makes no host tensor,
reads nothing back and waits for nothing between positions; a proposal then replays it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig, PretrainedConfig

from gpu_worker.runner.load_model import Model
from gpu_worker.runner.spec_decode.draft_loop import DraftDecodeLoop
from harness.gpu_worker.fake_cuda import (
    DEVICE,
    CheckedCapture,
    fake_cuda,
    model_on_fake_cuda,
    paged_model,
    triton_backend,
)
from harness.models.family_models import FAMILIES, SMALL

NUM_POSITIONS = 3  # four drafts a request: the catch-up's, then these
NUM_BLOCKS = 16
BLOCK_SIZE = 16
# A layer's attention in a decode step: the KV write, the decode kernel and its merge.
DECODE_ATTENTION = ["_kv_write_kernel", "_paged_decode_kernel", "_merge_kernel"]


def _llama() -> PretrainedConfig:
    sizes: dict[str, Any] = SMALL
    return LlamaConfig(**sizes)


# The Llama family through the worker's own decoder, and one through transformers' forward.
CONFIGS = {"llama": _llama, "gemma2": FAMILIES["gemma2"]}


def _loop(model: Model, capture: CheckedCapture) -> DraftDecodeLoop:
    """The loop over a pool of 16 blocks of 16 tokens (and the spare one) read by the triton backend,
    sequences up to 128 tokens, batches up to 6 (sizes 1, 2, 4, 6)."""
    backend = triton_backend(model, NUM_BLOCKS + 1)
    return DraftDecodeLoop(
        model,
        backend,
        max_num_seqs=6,
        max_model_len=128,
        num_graph_positions=NUM_POSITIONS,
        spare_slot=NUM_BLOCKS * BLOCK_SIZE,
        device=DEVICE,
        padded=True,
        capture=capture,
    )


@pytest.mark.parametrize("family", list(CONFIGS))
def test_the_later_positions_are_one_graph_per_size(family: str) -> None:
    hf_model = paged_model(CONFIGS[family]())
    capture = CheckedCapture()
    with fake_cuda() as mode:
        model = model_on_fake_cuda(hf_model, mode)
        loop = _loop(model, capture)
        loop.capture()
        # A proposal of three rows (padded to four), its inputs on the device as the proposer
        # uploads them, asking fewer positions than the graph runs.
        first_drafts = torch.zeros(3, dtype=torch.long, device=DEVICE)
        first_positions = torch.zeros(3, dtype=torch.long, device=DEVICE)
        block_tables = torch.zeros((3, 2), dtype=torch.long, device=DEVICE)
        drafts = loop.run(first_drafts, first_positions, first_positions, block_tables, NUM_POSITIONS - 1)
    assert loop.failed == {}
    assert loop.captured_sizes == [1, 2, 4, 6]
    assert capture.num_warm_ups == capture.num_captures == 4
    # Every position's forward is inside the one graph: per layer, the KV write and the decode.
    layers = int(model.config.num_hidden_layers)
    for graph in capture.graphs:
        assert graph.launches == DECODE_ATTENTION * layers * NUM_POSITIONS
    # The proposal replayed the graph of size 4 (captured second: 6, 4, 2, 1), rules and all.
    assert loop.num_replays == 1
    assert [graph.num_replays for graph in capture.graphs] == [0, 1, 0, 0]
    assert tuple(drafts.shape) == (3, 1 + NUM_POSITIONS)
