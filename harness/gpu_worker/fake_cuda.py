"""A CUDA device on a machine without one, for the capture-rules lane (capture_rules.py).

torch's FakeTensorMode holds `cuda` tensors as shape, dtype and device without memory, so the worker's
own code builds its model, KV pool, attention backend, decode and piecewise graphs on "cuda" here as on a
GPU (`Decoder(...)` over a model moved to the device, `allocate_kv_cache(..., device)`), and runs
them: every op computes metadata only. In a torch built without CUDA, indexing such a tensor needs a
device guard for CUDA, which `fake_cuda()` registers (a no-op one, fake_cuda_guard.cpp, built with
the host's compiler at first use and cached by torch's extension builder). `CheckedCapture`
captures a step by running it under `capture_rules()`, so a step that a GPU's capture would refuse
raises here the same kind of error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.modeling_utils import PreTrainedModel
from triton.runtime.jit import KernelInterface

from common.protocol import SamplingParams
from gpu_worker.runner.attention.backend import AttentionBackend, AttentionContext
from gpu_worker.runner.attention.selector import make_attention_backend
from gpu_worker.runner.attention.transformers_interface import register_paged_attention
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.forward.decoder import FAMILIES, Decoder
from gpu_worker.runner.graphs.capture import GraphCapture
from gpu_worker.runner.graphs.decode import DecodeGraphs
from gpu_worker.runner.graphs.piecewise import PiecewiseGraphs
from gpu_worker.runner.input_batch import InputBatch, ScheduledRequest, build_input_batch
from gpu_worker.runner.load_model import Model, allocate_kv_cache, kv_shape
from harness.gpu_worker.capture_rules import capture_rules, patched

GUARD_SOURCE = Path(__file__).with_name("fake_cuda_guard.cpp")
CAPABILITY = (9, 0)
# With its index: `cuda` alone asks the (absent) driver which device is current.
DEVICE = torch.device("cuda", 0)


@functools.cache
def _register_guard() -> None:
    if torch.backends.cuda.is_built():
        return  # a CUDA build has its own
    from torch.utils import cpp_extension

    cpp_extension.load(
        name="cbserve_fake_cuda_guard", sources=[str(GUARD_SOURCE)], is_python_module=False, verbose=False
    )


def _no_launch(kernel: Any, grid: Any) -> Callable[..., None]:
    return lambda *args, **kwargs: None


@contextlib.contextmanager
def fake_cuda() -> Iterator[FakeTensorMode]:
    """Tensors made inside are fake; `cuda` ones are allowed. Under inference mode, as the worker's
    steps are (autograd would ask the absent driver for a device guard). Triton kernels are not run:
    a fake tensor has no memory (capture_rules() checks their launches)."""
    _register_guard()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(KernelInterface, "__getitem__", _no_launch))
        # Asked by code that picks kernels by architecture (transformers' MoE): a Hopper's.
        stack.enter_context(patched(torch.cuda, "get_device_capability", lambda device=None: CAPABILITY))
        stack.enter_context(mode)
        stack.enter_context(torch.inference_mode())
        yield mode


def to_fake_cuda(module: torch.nn.Module, mode: FakeTensorMode) -> None:
    """Every parameter and buffer of `module`, in place, as a fake tensor on the device."""
    module._apply(lambda t: mode.from_tensor(t).to(DEVICE))


def load_hf_model(model_dir: Path, dtype: torch.dtype = torch.bfloat16) -> PreTrainedModel:
    """The checkpoint on the host as `load_model` loads it (paged attention plugged in), before the
    fake device is entered: load it outside `fake_cuda()`."""
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, config=config, attn_implementation=register_paged_attention(), dtype=dtype
    )
    model.eval()
    return model


def model_on_fake_cuda(hf_model: PreTrainedModel, mode: FakeTensorMode) -> Model:
    """What `load_model` returns on cuda (uncompiled: inductor needs a real device): the worker's
    decoder for the Llama family, transformers' forward for the others. Moves `hf_model`."""
    to_fake_cuda(hf_model, mode)
    if hf_model.config.model_type in FAMILIES:
        return Decoder(hf_model, None)
    return hf_model


def paged_model(config: PretrainedConfig) -> PreTrainedModel:
    """A bfloat16 model of `config` (seeded) with the worker's paged attention, as `load_model` makes
    it before it moves to the device."""
    torch.manual_seed(0)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(
        config, attn_implementation=register_paged_attention(), dtype=torch.bfloat16
    )
    return model.eval()


def triton_backend(model: Model, num_blocks: int = 16) -> AttentionBackend[Any]:
    """The triton backend (the one captured) over a pool of `num_blocks` blocks of 16 tokens in the
    model's dtype, on the device."""
    pool = allocate_kv_cache(kv_shape(model.config), num_blocks, 16, model.dtype, DEVICE)
    return make_attention_backend("triton", pool, group_decodes=False, dtype=model.dtype)


def decode_graphs(model: Model, capture: GraphCapture, max_num_seqs: int) -> DecodeGraphs:
    """The worker's decode graphs of `model` on the device (`triton_backend`), sequences up to 128
    tokens."""
    backend = triton_backend(model)
    return DecodeGraphs(
        model, backend, max_num_seqs=max_num_seqs, max_model_len=128, device=DEVICE, capture=capture
    )


def piecewise_graphs(model: Decoder, capture: GraphCapture, max_num_batched_tokens: int) -> PiecewiseGraphs:
    """The worker's piecewise graphs of `model` on the device (`triton_backend`)."""
    backend = triton_backend(model)
    return PiecewiseGraphs(
        model, backend, max_num_batched_tokens=max_num_batched_tokens, device=DEVICE, capture=capture
    )


def decode_batch(backend: AttentionBackend[Any], mode: FakeTensorMode, context_lens: list[int]) -> InputBatch:
    """A decode step, one request per entry of `context_lens` (the tokens before the one it decodes)."""
    return step_batch(backend, mode, [(n, 1) for n in context_lens])


def step_batch(
    backend: AttentionBackend[Any], mode: FakeTensorMode, steps: list[tuple[int, int]]
) -> InputBatch:
    """A step of one request per (context, num_tokens) entry: `num_tokens` computed after `context`
    known ones (1: a decode, more: a prefill chunk), as `build_input_batch` makes it on a GPU: planned on
    the host, its tensors copied to the device (here the host planning runs on real tensors, since a
    fake one has no values to plan from)."""
    block_size = backend.kv_cache.block_size
    requests = []
    offset = 0
    for i, (n, num_tokens) in enumerate(steps):
        total = n + num_tokens
        blocks = -(-total // block_size)
        state = CachedRequestState(
            req_id=f"r{i}",
            token_ids=[(i + t) % 100 for t in range(total)],
            num_prompt_tokens=total,
            sampling_params=SamplingParams(temperature=0.0),
            block_ids=list(range(offset, offset + blocks)),
            num_computed_tokens=n,
            attempt=0,
        )
        offset += blocks
        requests.append(ScheduledRequest(state, num_tokens))
    with unset_fake_temporarily():
        batch = build_input_batch(requests, backend, torch.device("cpu"))

    def move(t: torch.Tensor) -> torch.Tensor:
        return mode.from_tensor(t).to(DEVICE)

    host = batch.attn_metadata.common
    common = dataclasses.replace(
        host,
        slot_mapping=move(host.slot_mapping),
        query_start_loc=move(host.query_start_loc),
        seq_lens=move(host.seq_lens),
        block_tables=move(host.block_tables),
    )
    context = AttentionContext(backend=backend, metadata=backend.build_metadata(common), common=common)
    return dataclasses.replace(
        batch,
        input_ids=move(batch.input_ids),
        position_ids=move(batch.position_ids),
        logits_indices=move(batch.logits_indices),
        attn_metadata=context,
    )


@dataclass(slots=True)
class CheckedGraph:
    """A step captured under the rules; a replay runs it again under them (the fake device has no
    kernels to replay)."""

    step: Callable[[], None]
    launches: list[str]  # the Triton kernels the capture launched, in order
    num_replays: int = 0

    def replay(self) -> None:
        self.num_replays += 1
        with capture_rules():
            self.step()


@dataclass(slots=True)
class CheckedCapture:
    """`graphs/capture.py`'s `GraphCapture` on the fake device: warm-up runs the step as it is, capture runs
    it under `capture_rules()`, raising `CaptureViolation` where a GPU's capture would fail."""

    num_warm_ups: int = 0
    num_captures: int = 0
    graphs: list[CheckedGraph] = field(default_factory=list)

    def warm_up(self, step: Callable[[], None]) -> None:
        self.num_warm_ups += 1
        step()

    def capture(self, step: Callable[[], None]) -> CheckedGraph:
        self.num_captures += 1
        with capture_rules() as rules:
            step()
        graph = CheckedGraph(step, rules.launches)
        self.graphs.append(graph)
        return graph

    def memory_used(self) -> int:
        return 0
