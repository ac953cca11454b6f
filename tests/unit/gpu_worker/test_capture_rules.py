"""The capture-rules lane: what CUDA forbids inside a graph capture, checked on the CPU with fake
`cuda` tensors (harness/gpu_worker/capture_rules.py, fake_cuda.py).

First the rules themselves, each of which must fail on what it names and pass what a capture
allows; then every region the worker captures: the decode graphs' step (`DecodeGraphs._step`,
through `DecodeGraphs.capture()`), for each family the worker serves, and the piecewise graphs' pieces
around attention (`PiecewiseGraphs.capture()`), for each family of the worker's own decoder. A review
predicted, before any GPU ran it, that the decode capture would die at startup for the Llama family
(the decoder built its `logits_to_keep` rows on the host and copied them in); this lane found exactly
that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from transformers import LlamaConfig, PretrainedConfig, Qwen3Config

from gpu_worker.kernels.triton.kv_write import kv_write
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.lora.layers import LoRAConfig
from gpu_worker.runner.sample.sampler import sample_plain, sample_top_k, sample_top_p
from gpu_worker.runner.sample.seeded_uniform import seeded_uniforms
from harness.gpu_worker.capture_rules import CaptureViolation, capture_rules
from harness.gpu_worker.fake_cuda import (
    DEVICE,
    CheckedCapture,
    decode_graphs,
    fake_cuda,
    model_on_fake_cuda,
    paged_model,
    piecewise_graphs,
    step_batch,
    to_fake_cuda,
)
from harness.models.family_models import FAMILIES, SMALL

# ---- the rules ---------------------------------------------------------------------------------------


def _host_tensor(x: torch.Tensor) -> object:
    return torch.arange(x.shape[0])


def _copy_in(x: torch.Tensor) -> object:
    return x + torch.ones(x.shape, device="cpu").to(x.device)


def _copy_into(x: torch.Tensor) -> object:
    return x.copy_(HOST)


def _masked(x: torch.Tensor) -> object:
    return x[x > 0]


def _triton_host_slots(x: torch.Tensor) -> object:
    pool = torch.empty((2, 4, 1, 8), device=DEVICE)
    kv = torch.empty((3, 1, 8), device=DEVICE)
    kv_write(kv, kv, pool, pool, HOST_SLOTS)
    return None


# Made before the region, on the host.
HOST = torch.zeros(3)
HOST_SLOTS = torch.zeros(3, dtype=torch.long)
HOST_SCALAR = torch.tensor(2.0)
FORBIDDEN: dict[str, tuple[Callable[[torch.Tensor], object], str]] = {
    "arange on the host": (_host_tensor, "aten.arange.default makes a host tensor"),
    "torch.tensor": (lambda x: torch.tensor([1, 2]), "makes a host tensor"),
    "host tensor copied in": (_copy_in, "makes a host tensor"),
    "copy_ from the host": (_copy_into, "copies host memory to the device"),
    "to() of a host tensor": (lambda x: HOST.to(x.device), "copies host memory to the device"),
    ".item()": (lambda x: x.sum().item(), "reads a device value on the host"),
    ".tolist()": (lambda x: x.tolist(), "reads a device value on the host"),
    "bool()": (lambda x: bool(x.sum() > 0), "reads a device value on the host"),
    ".cpu()": (lambda x: x.cpu(), "copies device memory to the host"),
    "nonzero": (lambda x: x.nonzero(), "its output's shape depends on device data"),
    "masked_select": (lambda x: x.masked_select(x > 0), "its output's shape depends on device data"),
    "boolean mask index": (_masked, "indexes with a boolean mask"),
    "unique": (lambda x: x.unique(), "its output's shape depends on device data"),
    "repeat_interleave": (
        lambda x: torch.repeat_interleave(x.long().clamp(0, 2)),
        "repeat_interleave without output_size",
    ),
    "torch.cuda.synchronize": (lambda x: torch.cuda.synchronize(), "torch.cuda.synchronize waits"),
    "a kernel given host memory": (_triton_host_slots, "_kv_write_kernel gets a host tensor argument"),
}


@pytest.mark.parametrize("name", list(FORBIDDEN))
def test_each_rule_fails_on_what_it_names(name: str) -> None:
    region, message = FORBIDDEN[name]
    with fake_cuda():
        x = torch.ones(3, device=DEVICE)
        with pytest.raises(CaptureViolation, match=message) as caught, capture_rules():
            region(x)
    # The project's own line, not torch's or the harness's: where to fix it.
    where = "gpu_worker/kernels/triton/kv_write.py" if "kernel" in name else "test_capture_rules.py"
    assert f"at {where}" in str(caught.value) or f"/{where}:" in str(caught.value)


def test_what_a_capture_allows_passes() -> None:
    with fake_cuda():
        x = torch.ones(3, device=DEVICE)
        out = torch.zeros(3, device=DEVICE)
        pool = torch.empty((2, 4, 1, 8), device=DEVICE)
        kv = torch.empty((3, 1, 8), device=DEVICE)
        with capture_rules() as rules:
            rows = torch.arange(3, device=x.device)  # made on the device
            out.copy_(x.index_select(0, rows) * HOST_SCALAR + 1.0)  # a 0-dim host tensor: a scalar
            out[torch.zeros(1, dtype=torch.long, device=DEVICE)] = 0.0  # integer index, scalar value
            torch.repeat_interleave(rows, rows, output_size=3)
            kv_write(kv, kv, pool, pool, rows)
    assert rules.launches == ["_kv_write_kernel"]


# ---- the regions the worker captures -----------------------------------------------------------------

SIZES: dict[str, Any] = SMALL

# Every family the worker serves: the Llama family through its own decoder, the rest through
# transformers' forward with paged attention.
CONFIGS: dict[str, Callable[[], PretrainedConfig]] = {
    "llama": lambda: LlamaConfig(**SIZES),
    "qwen3": lambda: Qwen3Config(**SIZES, head_dim=32),
    **{name: FAMILIES[name] for name in ("mistral", "qwen2_window", "gemma2", "gemma3", "phi3")},
    **{name: FAMILIES[name] for name in ("gpt_oss", "qwen3_moe")},
}
NUM_LAYERS = {"gemma3": 3}
# A layer's attention in a decode graph: the KV write, the decode kernel and its merge.
DECODE_ATTENTION = ["_kv_write_kernel", "_paged_decode_kernel", "_merge_kernel"]


@pytest.mark.parametrize("family", list(CONFIGS))
def test_decode_graphs_capture_every_size(family: str) -> None:
    hf_model = paged_model(CONFIGS[family]())
    capture = CheckedCapture()
    with fake_cuda() as mode:
        model = model_on_fake_cuda(hf_model, mode)
        assert isinstance(model, Decoder) == (family in ("llama", "qwen3", "mistral", "qwen2_window"))
        graphs = decode_graphs(model, capture, max_num_seqs=6)
        graphs.capture()
    assert graphs.failed == {}
    assert graphs.captured_sizes == [1, 2, 4, 6]
    assert capture.num_warm_ups == capture.num_captures == 4
    # The attention inside was traversed, not faked: each layer writes K/V and attends the decodes,
    # split in two (128-token contexts) and merged.
    layers = NUM_LAYERS.get(family, 2)
    for graph in capture.graphs:
        assert graph.launches == DECODE_ATTENTION * layers


def _lora_decoder(mode: FakeTensorMode) -> Decoder:
    """The Llama decoder on the fake device with two LoRA slots of rank 8, through the Triton kernels
    (its weights made on the host first, as `load_model` does)."""
    with unset_fake_temporarily():
        hf_model = paged_model(LlamaConfig(**SIZES))
    to_fake_cuda(hf_model, mode)
    return Decoder(hf_model, None, LoRAConfig(max_loras=2, max_lora_rank=8, kernel="triton"))


def test_decode_graphs_capture_lora_slots() -> None:
    """The Llama decoder with LoRA slots on CUDA's path: the step's tokens sorted by slot on the
    device, and the shrink / expand kernels of every adapted linear inside the graph."""
    capture = CheckedCapture()
    with fake_cuda() as mode:
        graphs = decode_graphs(_lora_decoder(mode), capture, max_num_seqs=4)
        assert graphs.lora_ids is not None
        graphs.capture()
    assert graphs.failed == {} and graphs.captured_sizes == [1, 2, 4]
    # Per layer: q/k/v's shrink and three expands, attention, o's, gate/up's (two expands), down's.
    shrink, expand = "_lora_shrink_kernel", "_lora_expand_kernel"
    layer = [shrink, *[expand] * 3, *DECODE_ATTENTION, shrink, expand, shrink, expand, expand, shrink, expand]
    for graph in capture.graphs:
        assert graph.launches == layer * 2


# The decoder families whose layers split around attention, for the piecewise graphs.
DECODER_FAMILIES = ("llama", "qwen3", "mistral", "qwen2_window")


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_piecewise_graphs_capture_every_piece_of_every_bucket(family: str) -> None:
    """Every piece around attention (embeddings and layer 0's pre-attention, then each layer's
    post-attention with the next one's pre-attention) makes no host tensor and waits for nothing, at
    every token bucket; then a step of prefill chunks and decodes replays them, attention run eagerly
    between them."""
    hf_model = paged_model(CONFIGS[family]())
    capture = CheckedCapture()
    with fake_cuda() as mode:
        model = model_on_fake_cuda(hf_model, mode)
        assert isinstance(model, Decoder)
        graphs = piecewise_graphs(model, capture, max_num_batched_tokens=40)
        graphs.capture()
        assert graphs.failed == {}
        assert graphs.captured_buckets == [16, 32, 40]
        pieces = 1 + 2  # the first, one after each layer's attention
        assert capture.num_warm_ups == capture.num_captures == 3 * pieces
        assert all(graph.launches == [] for graph in capture.graphs)  # aten ops only: attention is out
        # Two decodes and a 20-token chunk over 5 cached tokens: 22 tokens, the bucket of 32. Each
        # piece replays under the rules again; attention, between them, is as free as any eager op.
        logits = graphs.run(step_batch(graphs.backend, mode, [(30, 1), (9, 1), (5, 20)]))
        assert logits.shape == (3, SIZES["vocab_size"])
    assert graphs.bucket_runs == {16: 0, 32: 1, 40: 0}
    of_32 = capture.graphs[pieces : 2 * pieces]  # captured largest bucket first
    assert [graph.num_replays for graph in of_32] == [1] * pieces


def test_piecewise_graphs_capture_lora_slots() -> None:
    """With LoRA slots on CUDA's path, each piece sorts the tokens by slot on the device and holds its
    adapted linears' shrink / expand kernels."""
    capture = CheckedCapture()
    with fake_cuda() as mode:
        graphs = piecewise_graphs(_lora_decoder(mode), capture, max_num_batched_tokens=32)
        assert graphs.lora_ids is not None
        graphs.capture()
    assert graphs.failed == {} and graphs.captured_buckets == [16, 32]
    shrink, expand = "_lora_shrink_kernel", "_lora_expand_kernel"
    pre = [shrink, *[expand] * 3]  # q/k/v
    post = [shrink, expand, shrink, expand, expand, shrink, expand]  # o, gate/up, down
    for bucket in range(2):
        first, between, last = capture.graphs[3 * bucket : 3 * bucket + 3]
        assert (first.launches, between.launches, last.launches) == (pre, post + pre, post)


# ---- the sampler's device functions (not captured today; kept capturable) ----------------------------


def test_sampler_paths_make_no_host_tensor_and_wait_for_nothing() -> None:
    with fake_cuda():
        scaled = torch.randn(4, 32, device=DEVICE)
        u = torch.rand(4, device=DEVICE)
        top_k = torch.full((4,), 5, dtype=torch.long, device=DEVICE)
        p = torch.full((4,), 0.9, device=DEVICE)
        seeds = torch.arange(4, device=DEVICE)
        with capture_rules():
            greedy = scaled.max(dim=-1).indices
            sample_plain(scaled, u, p)
            sample_top_k(scaled, u, top_k, 5, p)
            sample_top_p(scaled, u, p, top_k, p)
            seeded_uniforms(seeds, seeds)
    assert greedy.shape == (4,)
