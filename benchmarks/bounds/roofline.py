"""This machine's roofline for a decode step, and the share of it each compared system reached.

    python -m benchmarks.bounds.roofline --threads 2  # the machine: copy bandwidth and fp32 GEMM peak (JSON)
    python -m benchmarks.serve compare --spec benchmarks/specs/cpu-llama-server.toml  # roofline = true

A decode step of B requests must read every weight once (the input embedding is only indexed) and
each request's K/V once, and do 2 flops per weight per request plus 4 per head dimension per context
token per layer (QK^T and PV). Its time is at least the larger of bytes / copy bandwidth and
flops / GEMM peak, both measured on this machine in the same run (the copy of
benchmarks.worker_step.decode_roofline, a square fp32 matmul at the servers' thread count); B over that
time is the decode bound in tokens/s.
The workload bound adds the prompts at the GEMM peak (2 flops per weight per prompt token, the LM
head only for each prompt's last), since a server computes them too: output tokens / (prompt time +
decoded tokens / B x step time), each request's first token coming from its prompt's forward. Bytes
per weight and per K/V element are each system's own (fp32, int8 weights, llama.cpp's q8_0, its f16
KV cache), so a system that reads fewer bytes has a higher bound. The context is the workload's own:
the mean over output tokens of the context each is decoded at.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.baselines.llama_launch import LlamaServerOptions
from benchmarks.load.specs import SystemSpec
from benchmarks.workloads.datasets import SampleRequest
from common.lora.lora_adapter import TARGET_MODULES, BaseModelShapes

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


@dataclass(frozen=True, slots=True)
class ModelShape:
    decoder: BaseModelShapes  # layers, heads, linears (read as for LoRA, common/lora/lora_adapter.py)
    vocab: int
    dtype: str  # the checkpoint's

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        return cls(BaseModelShapes.from_config(config), int(config["vocab_size"]), dtype)

    @property
    def weights_read(self) -> int:
        """Weights a decode step reads: every layer's projections and MLP, and the LM head."""
        decoder = self.decoder
        per_layer = sum(math.prod(decoder.features(module)) for module in TARGET_MODULES)
        return decoder.num_hidden_layers * per_layer + self.vocab * decoder.hidden_size


@dataclass(frozen=True, slots=True)
class Precision:
    name: str
    weight_bytes: float  # per weight
    kv_bytes: float  # per K or V element


@dataclass(frozen=True, slots=True)
class Machine:
    threads: int
    copy_gb_s: float  # bytes read + written per second by a large tensor copy, / 1e9
    gemm_gflop_s: float  # a square fp32 matmul


def precision_of(system: SystemSpec, shape: ModelShape) -> Precision:
    """The bytes a system's weights and K/V take, from its launch settings."""
    launch = system.launch
    if launch is not None and launch.kind == "llama-server":
        llama = LlamaServerOptions.from_options(launch.options)
        return Precision(f"gguf {llama.outtype}", llama.weight_bytes, llama.kv_bytes)
    env = launch.env if launch is not None else {}
    options = launch.options if launch is not None else {}
    dtype = str(env.get("WORKER_DTYPE") or options.get("dtype") or shape.dtype)
    element = DTYPE_BYTES.get(dtype, 4.0)
    kv_dtype = str(env.get("WORKER_KV_CACHE_DTYPE") or "auto")
    kv_dtype = dtype if kv_dtype == "auto" else kv_dtype
    kv_element = DTYPE_BYTES.get(kv_dtype, element)
    quantization = env.get("WORKER_QUANTIZATION")
    if quantization:  # int8 / fp8: one byte a weight (the per-channel scales are a rounding error)
        return Precision(f"{quantization} weights, {kv_dtype} KV", 1.0, kv_element)
    if kv_dtype != dtype:
        return Precision(f"{dtype}, {kv_dtype} KV", element, kv_element)
    return Precision(dtype, element, element)


def decode_context(requests: Sequence[SampleRequest]) -> float:
    """The mean, over output tokens, of the context each is decoded at."""
    outputs = sum(r.output_len for r in requests)
    total = sum(r.output_len * r.prompt_len + r.output_len * (r.output_len - 1) / 2 for r in requests)
    return total / outputs if outputs else 0.0


@dataclass(frozen=True, slots=True)
class Bound:
    system: str
    precision: str
    step_mb: float  # bytes a decode step reads, / 1e6
    step_gflop: float
    decode_tok_s: float  # B / max(bytes / bandwidth, flops / peak)
    workload_tok_s: float  # with the prompts at the GEMM peak
    measured_tok_s: float | None = None

    @property
    def decode_fraction(self) -> float | None:
        return None if self.measured_tok_s is None else self.measured_tok_s / self.decode_tok_s

    @property
    def workload_fraction(self) -> float | None:
        return None if self.measured_tok_s is None else self.measured_tok_s / self.workload_tok_s


def bound_for(
    name: str,
    shape: ModelShape,
    precision: Precision,
    machine: Machine,
    batch: int,
    context: float,
    prompt_tokens: int,
    output_tokens: int,
    num_requests: int = 0,
    measured_tok_s: float | None = None,
) -> Bound:
    weights, decoder = shape.weights_read, shape.decoder
    kv_per_token = decoder.num_hidden_layers * decoder.num_key_value_heads * decoder.head_dim
    kv_elements = batch * context * 2 * kv_per_token
    step_bytes = weights * precision.weight_bytes + kv_elements * precision.kv_bytes
    q_per_token = decoder.num_hidden_layers * decoder.num_attention_heads * decoder.head_dim
    step_flops = 2 * weights * batch + 4 * q_per_token * context * batch
    step_s = max(step_bytes / (machine.copy_gb_s * 1e9), step_flops / (machine.gemm_gflop_s * 1e9))
    lm_head = shape.vocab * decoder.hidden_size  # a prompt needs the logits of its last token only
    prompt_flops = 2 * (weights - lm_head) * prompt_tokens + 2 * lm_head * num_requests
    prompt_s = prompt_flops / (machine.gemm_gflop_s * 1e9)
    # Each request's first token comes out of its prefill; the rest take a decode step's share each.
    workload_s = prompt_s + (output_tokens - num_requests) / batch * step_s
    return Bound(
        system=name,
        precision=precision.name,
        step_mb=step_bytes / 1e6,
        step_gflop=step_flops / 1e9,
        decode_tok_s=batch / step_s,
        workload_tok_s=output_tokens / workload_s if workload_s else 0.0,
        measured_tok_s=measured_tok_s,
    )


def roofline(
    model_dir: str | Path,
    systems: Sequence[SystemSpec],
    measured: dict[str, float],
    machine: Machine,
    batch: int,
    requests: Sequence[SampleRequest],
) -> list[Bound]:
    """Each system's bounds at `batch` in flight on `requests`, with its measured output tokens/s."""
    shape = ModelShape.from_config(json.loads((Path(model_dir) / "config.json").read_text()))
    context = decode_context(requests)
    prompt_tokens = sum(r.prompt_len for r in requests)
    output_tokens = sum(r.output_len for r in requests)
    return [
        bound_for(
            s.name,
            shape,
            precision_of(s, shape),
            machine,
            batch,
            context,
            prompt_tokens,
            output_tokens,
            len(requests),
            measured.get(s.name),
        )
        for s in systems
    ]


def format_roofline(machine: Machine, bounds: Sequence[Bound], batch: int, context: float) -> str:
    from benchmarks.figures.report import render_table

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.0f}%"

    head = (
        f"Roofline of this machine ({machine.threads} threads): copy {machine.copy_gb_s:.1f} GB/s, "
        f"fp32 GEMM {machine.gemm_gflop_s:.1f} GFLOP/s; decode step at {batch} in flight, "
        f"mean context {context:.0f} tokens"
    )
    table = [["system", "precision", "MB/step", "GFLOP/step", "decode bound", "workload bound"]]
    table[0] += ["measured tok/s", "of decode", "of workload"]
    for b in bounds:
        measured = "-" if b.measured_tok_s is None else f"{b.measured_tok_s:.1f}"
        bounds_cells = [
            f"{b.step_mb:.0f}",
            f"{b.step_gflop:.2f}",
            f"{b.decode_tok_s:.1f}",
            f"{b.workload_tok_s:.1f}",
        ]
        table.append(
            [b.system, b.precision, *bounds_cells, measured, pct(b.decode_fraction), pct(b.workload_fraction)]
        )
    return head + "\n" + render_table(table)


def _bound_record(bound: Bound) -> dict[str, Any]:
    return {
        **asdict(bound),
        "decode_fraction": bound.decode_fraction,
        "workload_fraction": bound.workload_fraction,
    }


def roofline_record(machine: Machine, bounds: Sequence[Bound], batch: int, context: float) -> dict[str, Any]:
    return {
        "machine": asdict(machine),
        "batch": batch,
        "mean_decode_context": context,
        "systems": {b.system: _bound_record(b) for b in bounds},
    }


def report(
    model_dir: str | Path,
    systems: Sequence[SystemSpec],
    rounds: Sequence[dict[str, Any]],
    machine: Machine,
    batch: int,
    requests: Sequence[SampleRequest],
) -> dict[str, Any]:
    """Prints the roofline table of a comparison (each system's median over rounds) and returns its record."""
    measured = {
        s.name: statistics.median(r[s.name]["output_throughput"] for r in rounds if s.name in r)
        for s in systems
        if any(s.name in r for r in rounds)
    }
    bounds = roofline(model_dir, systems, measured, machine, batch, requests)
    context = decode_context(requests)
    print(format_roofline(machine, bounds, batch, context))
    return roofline_record(machine, bounds, batch, context)


def measure_machine(threads: int, timeout_s: float = 300.0) -> Machine:
    """This machine's copy bandwidth and GEMM peak, measured in a child process (it imports torch)."""
    argv = [sys.executable, "-m", "benchmarks.bounds.roofline", "--threads", str(threads)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"measuring the roofline failed:\n{done.stderr[-2000:]}")
    return Machine(**json.loads(done.stdout.strip().splitlines()[-1]))


def gemm_peak(n: int = 2048, repeats: int = 5) -> float:
    """fp32 flops per second of an n x n x n matmul (torch's threads as set)."""
    import torch

    a = torch.randn(n, n)
    b = torch.randn(n, n)
    torch.matmul(a, b)  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    return 2 * n**3 * repeats / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bounds.roofline", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the servers' own count)")
    parser.add_argument("--copy-mb", type=int, default=256, help="size of the copied tensor")
    args = parser.parse_args(argv)
    import torch

    from benchmarks.worker_step.decode_roofline import copy_bandwidth

    torch.set_num_threads(args.threads)
    copy = copy_bandwidth(torch.device("cpu"), args.copy_mb << 20, repeats=5)
    machine = Machine(args.threads, copy / 1e9, gemm_peak() / 1e9)
    print(json.dumps(asdict(machine)))


if __name__ == "__main__":
    main()
