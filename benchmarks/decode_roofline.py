"""Decode steps against the memory roofline: the worker's ModelRunner on a model built in memory.

    python -m benchmarks.decode_roofline --shape llama3-8b --batches 1,16,64,128 --context 1024 \
        --device cuda --dtype bfloat16 --result-file decode.json

A decode step must read every weight once and every request's K/V once, so its floor is
(weight bytes + KV bytes) / memory bandwidth. This builds a random-weight model of `--shape` directly
on the device (no file: an 8B model would take longer to write than to measure), puts `batch`
requests whose first `--context - 1` tokens are already in the KV pool, and times `--steps` pure
decode steps through `ModelRunner.execute_model`, the worker's own step. Bandwidth is reported
against a device copy measured in the same run. `--shape tiny --device cpu` is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from common.protocol import CachedRequestData, NewRequestData, SamplingParams, SchedulerOutput

# name -> (hidden, layers, heads, kv_heads, mlp, vocab)
SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "llama3-8b": (4096, 32, 32, 8, 14336, 128256),
    "llama-1b": (2048, 22, 32, 4, 5632, 32000),
    "tiny": (64, 2, 4, 2, 128, 512),
}


@dataclass(slots=True)
class DecodeResult:
    batch: int
    context: int
    step_ms: float  # median over the timed steps
    weight_bytes: int  # read once per step (the input embedding table is not: it is only indexed)
    kv_bytes: int  # K and V of every request's context, read once per step
    achieved_gb_s: float
    bandwidth_fraction: float  # achieved / measured copy bandwidth


def build_model(shape: str, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from gpu_worker.attention import register_paged_attention

    hidden, layers, heads, kv_heads, mlp, vocab = SHAPES[shape]
    config = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=mlp,
        vocab_size=vocab,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=register_paged_attention()
        )
    return model.eval()


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


def kv_bytes_per_token(model: PreTrainedModel, dtype: torch.dtype) -> int:
    from gpu_worker.model_loader import kv_shape

    shape = kv_shape(model.config)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * itemsize


def time_decode(runner: object, batch: int, context: int, warmup: int, steps: int, step_id: int) -> float:
    """Median ms of a decode step of `batch` requests at `context` tokens (growing by one a step)."""
    from gpu_worker.model_runner import ModelRunner

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
    times = []
    for i in range(warmup + steps):
        started = time.perf_counter()
        result = runner.execute_model(output)  # returns after the sampled ids reached the host
        if i >= warmup:
            times.append(time.perf_counter() - started)
        assert not result.req_errors, result.req_errors
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
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decode_roofline", description=__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--batches", default="1,16,64,128")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--env", default="", help="extra worker settings, e.g. cuda_graphs=false,attention_backend=torch"
    )
    parser.add_argument("--result-file", type=Path)
    args = parser.parse_args(argv)

    from gpu_worker.model_runner import ModelRunner
    from gpu_worker.settings import WorkerSettings

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    torch.manual_seed(0)
    started = time.perf_counter()
    model = build_model(args.shape, device, dtype)
    build_s = time.perf_counter() - started
    per_token = kv_bytes_per_token(model, dtype)
    blocks_each = -(-(args.context + args.warmup + args.steps + 1) // args.block_size)
    extra = dict(kv.split("=", 1) for kv in args.env.split(",") if kv)
    settings = WorkerSettings(
        model=f"<in-memory {args.shape}>",
        device=args.device,
        dtype=args.dtype,
        block_size=args.block_size,
        num_blocks=max(batches) * blocks_each,
        **extra,
    )
    runner = ModelRunner(settings, model=model)
    bandwidth = copy_bandwidth(device, 1 << 30 if device.type == "cuda" else 1 << 26)
    weights = weight_bytes(model)
    results = []
    step_id = 0
    for batch in batches:
        ms = time_decode(runner, batch, args.context, args.warmup, args.steps, step_id)
        step_id += args.warmup + args.steps + 1
        # The context grows from `context` by one a step; the middle of the timed steps stands for all.
        mean_context = args.context + args.warmup + args.steps // 2
        kv = batch * mean_context * per_token
        achieved = (weights + kv) / (ms / 1000)
        results.append(
            DecodeResult(batch, args.context, ms, weights, kv, achieved / 1e9, achieved / bandwidth)
        )
        print(
            f"batch {batch:4d} context {args.context}: {ms:7.2f} ms/step, "
            f"{achieved / 1e9:7.1f} GB/s = {100 * achieved / bandwidth:5.1f}% of copy bandwidth",
            flush=True,
        )
    summary = {
        "shape": args.shape,
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "model_build_s": build_s,
        "worker": {k: str(v) for k, v in extra.items()},
        "decode": [asdict(r) for r in results],
    }
    print(json.dumps(summary, indent=2))
    if args.result_file:
        args.result_file.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
