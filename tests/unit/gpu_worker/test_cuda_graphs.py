"""DecodeGraphs' capture and replay on the fake CUDA device (harness/gpu_worker/fake_cuda.py), where a
capture fails as on a GPU, at what CUDA forbids (harness/gpu_worker/capture_rules.py).

A size whose capture fails runs eagerly from the same buffers, with one warning for all such sizes,
and the worker starts; an error in the warm-up (the step run as every step will run it) still stops it.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from transformers import LlamaConfig, PreTrainedModel

from gpu_worker.runner.forward.decoder import Decoder, DecoderOutput
from gpu_worker.runner.graphs.decode import DecodeGraphs
from harness.gpu_worker.fake_cuda import (
    CheckedCapture,
    decode_batch,
    decode_graphs,
    fake_cuda,
    paged_model,
    to_fake_cuda,
)
from harness.models.family_models import SMALL


class HostIndexDecoder(Decoder):
    """The Llama decoder, but for batches of more than two rows it builds the rows to keep on the host
    and copies them in, as `Decoder.forward` once did: eagerly that runs, a capture refuses it."""

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: torch.Tensor | int,
        *args: Any,  # the step's context and the rest, passed on as they came
        **kwargs: Any,
    ) -> DecoderOutput:
        if input_ids.shape[1] > 2:
            logits_to_keep = torch.arange(input_ids.shape[1]).to(input_ids.device)
        return super().forward(input_ids, position_ids, logits_to_keep, *args, **kwargs)


class BrokenDecoder(Decoder):
    """A forward that fails whether captured or not."""

    def forward(self, *args: object, **kwargs: object) -> DecoderOutput:
        raise RuntimeError("this forward never works")


def _hf_llama() -> PreTrainedModel:
    sizes: dict[str, Any] = SMALL
    return paged_model(LlamaConfig(**sizes))


def _graphs(
    decoder: type[Decoder], mode: FakeTensorMode, capture: CheckedCapture, max_num_seqs: int
) -> DecodeGraphs:
    """The tiny Llama's weights on the fake device behind `decoder`, and its decode graphs; the
    model is made before the fake device is entered (its weights real, then moved)."""
    with unset_fake_temporarily():
        hf_model = _hf_llama()
    to_fake_cuda(hf_model, mode)
    return decode_graphs(decoder(hf_model, None), capture, max_num_seqs)


def test_a_failed_capture_runs_its_size_eagerly_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    capture = CheckedCapture()
    with fake_cuda() as mode:
        graphs = _graphs(HostIndexDecoder, mode, capture, max_num_seqs=6)
        backend = graphs.backend
        with caplog.at_level(logging.WARNING, logger="gpu_worker.runner.graphs.decode"):
            graphs.capture()
        assert graphs.captured_sizes == [1, 2]
        assert sorted(graphs.failed) == [4, 6]
        for why in graphs.failed.values():
            assert "copies host memory to the device" in why or "makes a host tensor" in why
            assert "test_cuda_graphs.py" in why  # the line that did it
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "decode batches of 4, 6 rows: they run eagerly" in warnings[0].getMessage()

        # Two rows replay the graph of size 2; three are padded to 4 and run eagerly.
        graph_of_2, graph_of_1 = capture.graphs  # captured largest first
        logits = graphs.run(decode_batch(backend, mode, [5, 9]))
        assert logits.shape == (2, SMALL["vocab_size"])
        assert graph_of_2.num_replays == 1
        logits = graphs.run(decode_batch(backend, mode, [5, 9, 3]))
        assert logits.shape == (3, SMALL["vocab_size"])
        assert (graph_of_2.num_replays, graph_of_1.num_replays) == (1, 0)
        assert graphs.num_replays == 2


def test_an_error_in_the_warm_up_stops_the_worker() -> None:
    capture = CheckedCapture()
    with fake_cuda() as mode:
        graphs = _graphs(BrokenDecoder, mode, capture, max_num_seqs=2)
        with pytest.raises(RuntimeError, match="this forward never works"):
            graphs.capture()
    assert capture.num_captures == 0
    assert graphs.captured_sizes == []
