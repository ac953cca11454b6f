"""Decode steps against the memory roofline: the worker's own forward, built as the worker builds it.

    python -m benchmarks.worker_step.decode_roofline --shape llama3-8b --batches 1,16,64,128 --context 1024 \
        --device cuda --dtype bfloat16 --result-file decode.json

A decode step must read every weight once and every request's K/V once, so its floor is
(weight bytes + KV bytes) / memory bandwidth. This builds a random-weight transformers model of
`--shape` directly on the device (no file: an 8B model would take longer to write than to measure),
then makes of it what gpu_worker/runner/load_model.py's `load_model` makes of a loaded one: the worker's
`Decoder` (merged GEMMs, WORKER_QUANTIZATION), compiled by `compile_decoder` unless WORKER_COMPILE is
false, and a `ModelRunner` around it (its profiling step, the KV pool, CUDA graphs for decode steps
on a GPU). It puts `batch` requests whose first `--context - 1` tokens are already in the KV pool and
times `--steps` pure decode steps through `ModelRunner.execute_model`, the worker's own step, two
ways: the forward alone (forward_timer.py: CUDA events on a GPU, perf_counter on the CPU) and the
whole step's wall time on the host (inputs, forward, sampling, the tokens back on the host). Both
are reported against a device copy measured in the same run. `--shape tiny --device cpu` is a smoke
run. Weight bytes are the checkpoint dtype's (a quantized run reads fewer).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PretrainedConfig, PreTrainedModel

from benchmarks.worker_step.forward_timer import ForwardTimer
from benchmarks.workloads.make_model import PRESETS, Preset
from common.protocol import CachedRequestData, NewRequestData, SamplingParams, SchedulerOutput
from gpu_worker.runner import load_model
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.forward.linear import check_quantization
from gpu_worker.runner.load_model import Model
from gpu_worker.settings import WorkerSettings

# The benchmark models' shapes (make_model.py), and Llama 3 8B's (no tokenizer: never saved).
SHAPES: dict[str, Preset] = {
    "llama3-8b": Preset(128256, 4096, 14336, 32, 32, 8, 8192, corpus_files=0),
    "llama-1b": PRESETS["llama-1b"],
    "tiny": PRESETS["tiny"],
}


@dataclass(slots=True)
class DecodeResult:
    batch: int
    context: int
    step_ms: float  # median wall time of the worker's step on the host
    forward_ms: float  # median device time of its forward (CUDA events; perf_counter on the CPU)
    host_ms: float  # median of step - forward: the step's work around the forward
    weight_bytes: int  # read once per step (the input embedding table is not: it is only indexed)
    kv_bytes: int  # K and V of every request's context, read once per step
    achieved_gb_s: float  # (weights + KV) / forward time
    bandwidth_fraction: float  # achieved / measured copy bandwidth: the forward
    step_bandwidth_fraction: float  # the same over the whole step: what the step loop delivers


def build_model(shape: str, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from gpu_worker.runner.attention.transformers_interface import register_paged_attention

    sizes = {**SHAPES[shape].config_sizes(), "max_position_embeddings": 8192}
    config = LlamaConfig(**sizes, tie_word_embeddings=False)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=register_paged_attention()
        )
    return model.eval()


def worker_forward(model: PreTrainedModel, settings: WorkerSettings) -> Model:
    """What `load_model` makes of a model it loaded: the quantization checked, then the same
    `load_model.worker_forward`."""
    device = torch.device(settings.device)
    check_quantization(settings.quantization, device)
    return load_model.worker_forward(model, settings, device)


def describe_forward(model: Model) -> str:
    """The worker's forward as built: the Decoder and what runs it (compiled or eager), or transformers'."""
    if not isinstance(model, Decoder):
        return f"{type(model).__name__} (transformers)"
    return "Decoder (eager)" if model.run == model.logits_of else f"Decoder ({type(model.run).__name__})"


def copy_bandwidth(device: torch.device, num_bytes: int = 1 << 30, repeats: int = 10) -> float:
    """Bytes moved per second by a device-to-device copy (each byte read once and written once)."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    _sync(device)
    return 2 * num_bytes * repeats / (time.perf_counter() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def weight_bytes(model: PreTrainedModel) -> int:
    embed = model.get_input_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)


def kv_bytes_per_token(config: PretrainedConfig, dtype: torch.dtype) -> int:
    from gpu_worker.runner.load_model import kv_shape

    shape = kv_shape(config)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * itemsize


@dataclass(slots=True)
class StepTimes:
    step_ms: list[float]  # each timed step's wall time on the host
    forward_ms: list[float]  # each timed step's forward on the device


def time_decode(
    runner: object, timer: ForwardTimer, batch: int, context: int, warmup: int, steps: int, step_id: int
) -> StepTimes:
    """Decode steps of `batch` requests at `context` tokens (growing by one a step), each timed."""
    from gpu_worker.runner.model_runner import ModelRunner

    assert isinstance(runner, ModelRunner)
    runner.reset()
    block_size = runner.block_size
    blocks_each = -(-(context + warmup + steps + 1) // block_size)
    assert batch * blocks_each <= runner.num_blocks, "KV pool too small for this batch and context"
    params = SamplingParams(max_tokens=warmup + steps + 2, temperature=0.0, ignore_eos=True)
    generator = torch.Generator().manual_seed(batch)
    vocab = runner.vocab_size
    new = [
        NewRequestData(
            req_id=f"b{batch}-{i}",
            prompt_token_ids=torch.randint(3, vocab, (context,), generator=generator).tolist(),
            output_token_ids=[],
            sampling_params=params,
            block_ids=list(range(i * blocks_each, (i + 1) * blocks_each)),
            num_computed_tokens=context - 1,  # the prompt's K/V "is already in the pool": one to decode
            attempt=0,
        )
        for i in range(batch)
    ]
    one_each = {n.req_id: 1 for n in new}
    output = SchedulerOutput(
        step_id=step_id,
        scheduled_new_reqs=new,
        scheduled_cached_reqs=[],
        num_scheduled_tokens=one_each,
        total_num_scheduled_tokens=batch,
        finished_req_ids=[],
    )
    times = StepTimes([], [])
    for i in range(warmup + steps):
        started = time.perf_counter()
        result = runner.execute_model(output)  # returns after the sampled ids reached the host
        elapsed = time.perf_counter() - started
        forwards = timer.take()
        assert not result.req_errors, result.req_errors
        assert len(forwards) == 1, f"a decode step ran {len(forwards)} forwards"
        if i >= warmup:
            times.step_ms.append(1000 * elapsed)
            times.forward_ms.append(forwards[0])
        output = SchedulerOutput(
            step_id=step_id + i + 1,
            scheduled_new_reqs=[],
            scheduled_cached_reqs=[
                CachedRequestData(req_id=n.req_id, new_block_ids=[], num_computed_tokens=context + i)
                for n in new
            ],
            num_scheduled_tokens=one_each,
            total_num_scheduled_tokens=batch,
            finished_req_ids=[],
        )
    return times


def decode_result(
    batch: int, context: int, times: StepTimes, weights: int, kv: int, bandwidth: float
) -> DecodeResult:
    step_ms = statistics.median(times.step_ms)
    forward_ms = statistics.median(times.forward_ms)
    host_ms = statistics.median(s - f for s, f in zip(times.step_ms, times.forward_ms, strict=True))
    achieved = (weights + kv) / (forward_ms / 1000)
    step_achieved = (weights + kv) / (step_ms / 1000)
    return DecodeResult(
        batch=batch,
        context=context,
        step_ms=step_ms,
        forward_ms=forward_ms,
        host_ms=host_ms,
        weight_bytes=weights,
        kv_bytes=kv,
        achieved_gb_s=achieved / 1e9,
        bandwidth_fraction=achieved / bandwidth,
        step_bandwidth_fraction=step_achieved / bandwidth,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.worker_step.decode_roofline", description=__doc__
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--batches", default="1,16,64,128")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--env", default="", help="extra worker settings, e.g. compile=false,attention_backend=torch"
    )
    parser.add_argument("--result-file", type=Path)
    args = parser.parse_args(argv)
    # The worker's own log lines (the compile and its seconds, the profiling step, CUDA graphs).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from gpu_worker.runner.model_runner import ModelRunner

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    blocks_each = -(-(args.context + args.warmup + args.steps + 1) // args.block_size)
    extra = dict(kv.split("=", 1) for kv in args.env.split(",") if kv)
    settings = WorkerSettings(
        model=f"<in-memory {args.shape}>",
        device=args.device,
        dtype=args.dtype,
        block_size=args.block_size,
        num_blocks=max(batches) * blocks_each,
        max_num_seqs=max(batches),  # CUDA graphs up to the largest batch, no further
        **extra,
    )
    torch.manual_seed(0)
    started = time.perf_counter()
    hf_model = build_model(args.shape, device, dtype)
    weights, per_token = weight_bytes(hf_model), kv_bytes_per_token(hf_model.config, dtype)
    model = worker_forward(hf_model, settings)
    del hf_model  # its unmerged q/k/v and gate/up weights
    build_s = time.perf_counter() - started
    started = time.perf_counter()
    runner = ModelRunner(settings, model=model)
    runner_s = time.perf_counter() - started
    timer = ForwardTimer(runner)
    bandwidth = copy_bandwidth(device, 1 << 30 if device.type == "cuda" else 1 << 26)
    results = []
    step_id = 0
    for batch in batches:
        times = time_decode(runner, timer, batch, args.context, args.warmup, args.steps, step_id)
        step_id += args.warmup + args.steps + 1
        # The context grows from `context` by one a step; the middle of the timed steps stands for all.
        mean_context = args.context + args.warmup + args.steps // 2
        result = decode_result(
            batch, args.context, times, weights, batch * mean_context * per_token, bandwidth
        )
        results.append(result)
        print(
            f"batch {batch:4d} context {args.context}: step {result.step_ms:7.2f} ms "
            f"(forward {result.forward_ms:7.2f} ms, host {result.host_ms:6.2f} ms), forward at "
            f"{result.achieved_gb_s:7.1f} GB/s = {100 * result.bandwidth_fraction:5.1f}% of copy bandwidth, "
            f"the step {100 * result.step_bandwidth_fraction:5.1f}%",
            flush=True,
        )
    summary = {
        "shape": args.shape,
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "forward": describe_forward(model),
        "cuda_graphs": runner.decode_graphs is not None and device.type == "cuda",  # decode steps replayed
        "forward_timer": "cuda events" if device.type == "cuda" else "perf_counter",
        "model_build_s": build_s,  # random weights on the device, the Decoder, a compile ahead
        "runner_build_s": runner_s,  # the profiling step (a first compile), the pool, CUDA graphs
        "worker": {k: str(v) for k, v in extra.items()},
        "decode": [asdict(r) for r in results],
    }
    print(json.dumps(summary, indent=2))
    if args.result_file:
        args.result_file.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
