"""The worker's forward variants side by side in one process: speed per step and greedy agreement.

    python -m benchmarks.worker_step.forward_ab --model models/gpt2-small-llama \
        --variants eager,compiled,int8-compiled --rounds 6 --decode-steps 8

Each variant is an in-process engine of its own (`LLMEngine`, cbserve/offline/engine.py: the scheduler
and a ModelRunner under WORKER_COMPILE, WORKER_QUANTIZATION and, with a `+kv-bfloat16` or `+kv-float16`
suffix, WORKER_KV_CACHE_DTYPE as its name says) with the same greedy requests. After every variant
has prefilled, rounds of `--decode-steps` decode steps alternate between the variants (the order
reversed every other round), so the machine's drift falls on all of them alike. Printed: ms per
decode step by round with the median and spread, and, against the first variant, the share of
requests whose greedy tokens are identical and the first position where the others diverge.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from batcher.core.scheduler import SchedulerConfig
from benchmarks.worker_step.batch_options import add_batch_options
from cbserve.offline.engine import LLMEngine
from common.protocol import SamplingParams, TokenEvent
from gpu_worker.runner.attention import torch_attn
from gpu_worker.runner.forward import compile as forward_compile
from gpu_worker.runner.forward import linear
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.settings import Quantization, WorkerSettings


@dataclass
class Variant:
    name: str
    engine: LLMEngine
    outputs: dict[str, list[int]] = field(default_factory=dict)
    ms_per_step: list[float] = field(default_factory=list)

    def step(self) -> None:
        step = self.engine.step()
        assert step.ran, "nothing to schedule"
        for event in step.events:
            if isinstance(event, TokenEvent):
                self.outputs.setdefault(event.req_id, []).append(event.token_id)


def parse_variant(name: str) -> tuple[bool, Quantization | None]:
    """`eager`, `compiled`, `int8-eager`, `int8-compiled`, `fp8-...`, and the earlier fp32 CPU paths
    for A/B: `gather-eager` / `-compiled` (decode attention gathers its K/V instead of the CPU
    kernel reading the pool) and `mkl-eager` / `-compiled` (that, and fp32 weights left unpacked, for
    `F.linear`) and `pywrap-compiled` (inductor's Python wrapper around its kernels instead of its C++
    one): (compile, quantization)."""
    earlier = ("gather", "mkl", "pywrap")
    quantization, _, mode = name.rpartition("-")
    known = quantization in ("", "int8", "fp8", *earlier) and (mode, quantization) != ("eager", "pywrap")
    if mode not in ("eager", "compiled") or not known:
        raise SystemExit(
            f"unknown variant {name!r}: [int8-|fp8-|gather-|mkl-]eager or "
            "[int8-|fp8-|gather-|mkl-|pywrap-]compiled"
        )
    return mode == "compiled", None if quantization in ("", *earlier) else quantization  # type: ignore[return-value]


def build(name: str, args: argparse.Namespace, prompts: list[list[int]]) -> Variant:
    """A variant by name, with `+kv-bfloat16` or `+kv-float16` on any name for WORKER_KV_CACHE_DTYPE."""
    base, _, kv_cache_dtype = name.partition("+kv-")
    if kv_cache_dtype not in ("", "bfloat16", "float16"):
        raise SystemExit(f"unknown variant {name!r}: the KV suffix is +kv-bfloat16 or +kv-float16")
    compile, quantization = parse_variant(base)
    settings = WorkerSettings(
        model=args.model,
        num_threads=args.num_threads,
        kv_cache_memory_mb=args.kv_cache_mb,
        max_num_seqs=len(prompts),
        max_num_batched_tokens=args.max_num_batched_tokens,
        compile=compile,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype or "auto",
        worker_id=name,
    )
    started = time.perf_counter()
    # The earlier paths are chosen at load (Linear packs its weight, the backend looks for the kernel),
    # so the choices are turned off for this load only.
    packs, kernels = linear.packs_on_cpu, torch_attn.cpu_kernels
    options = forward_compile.inductor_options
    if base.startswith("pywrap-"):
        forward_compile.inductor_options = lambda device: None
    if base.startswith("mkl-"):
        linear.packs_on_cpu = lambda weight: False
    if base.startswith(("mkl-", "gather-")):
        torch_attn.cpu_kernels = SimpleNamespace(load=lambda: False)  # type: ignore[assignment]
    try:
        runner = ModelRunner(settings)
    finally:
        linear.packs_on_cpu, torch_attn.cpu_kernels = packs, kernels
        forward_compile.inductor_options = options
    print(f"{name}: ready in {time.perf_counter() - started:.1f} s", flush=True)
    engine = LLMEngine(runner, SchedulerConfig())
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    return Variant(name, engine)


def agreement(reference: Variant, other: Variant, num_tokens: int) -> str:
    same, divergences = 0, []
    for req_id, tokens in reference.outputs.items():
        theirs = other.outputs.get(req_id, [])
        a, b = tokens[:num_tokens], theirs[:num_tokens]
        if a == b:
            same += 1
        else:
            divergences.append(
                next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            )
    head = f"{same}/{len(reference.outputs)} requests identical over {num_tokens} tokens"
    if not divergences:
        return head
    return f"{head}, first divergence at token {min(divergences)} (median {statistics.median(divergences)})"


def random_prompts(args: argparse.Namespace) -> list[list[int]]:
    from transformers import AutoConfig

    vocab_size = int(AutoConfig.from_pretrained(args.model).get_text_config().vocab_size)
    generator = torch.Generator().manual_seed(0)
    high = min(1000, vocab_size)
    return [
        torch.randint(3, high, (args.prompt_len,), generator=generator).tolist()
        for _ in range(args.num_requests)
    ]


def text_prompts(args: argparse.Namespace) -> list[list[int]]:
    """English text a trained model has seen the like of (standard-library docstrings), tokenized by
    the model's tokenizer: agreement on random ids says little about a real model."""
    import inspect
    import json
    import textwrap

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    docs = [
        inspect.getdoc(obj) or ""
        for module in (json, textwrap, inspect)
        for _, obj in inspect.getmembers(module)
    ]
    ids = tokenizer("\n\n".join(d for d in docs if d))["input_ids"]
    stride = max(1, (len(ids) - args.prompt_len) // args.num_requests)
    return [ids[i * stride : i * stride + args.prompt_len] for i in range(args.num_requests)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker_step.forward_ab", description=__doc__)
    add_batch_options(parser, decode_steps=8, num_threads=2)
    parser.add_argument("--variants", default="eager,compiled")
    parser.add_argument("--text-prompts", action="store_true", help="prompts of real text, not random ids")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    args.output_len = args.rounds * args.decode_steps + 1
    torch.set_num_threads(args.num_threads)
    prompts = text_prompts(args) if args.text_prompts else random_prompts(args)
    variants = [build(name, args, prompts) for name in args.variants.split(",")]
    for variant in variants:
        while variant.engine.has_prompts_to_compute():
            variant.step()
    for i in range(args.rounds):
        for variant in variants if i % 2 == 0 else reversed(variants):
            started = time.perf_counter()
            for _ in range(args.decode_steps):
                variant.step()
            variant.ms_per_step.append(1000 * (time.perf_counter() - started) / args.decode_steps)
    print(f"\n{args.num_requests} requests of {args.prompt_len} prompt tokens, {args.num_threads} threads")
    base = statistics.median(variants[0].ms_per_step)
    for variant in variants:
        ms = variant.ms_per_step
        median = statistics.median(ms)
        print(
            f"{variant.name:>16}: {median:7.1f} ms/decode step [{min(ms):.1f}-{max(ms):.1f}], "
            f"{1000 * args.num_requests / median:6.1f} tok/s, {base / median:.2f}x of {variants[0].name}"
        )
    for variant in variants[1:]:
        print(f"{variant.name:>16}: {agreement(variants[0], variant, args.output_len)}")


if __name__ == "__main__":
    main()
