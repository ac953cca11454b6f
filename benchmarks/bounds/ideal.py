"""What any server could reach on this machine for a workload: static vs ideal continuous batching.

    python -m benchmarks.bounds.ideal --spec benchmarks/specs/cpu-gpt2-small.toml --batch-size 16

Times transformers' bare forward on the spec's model (decode steps at several batch sizes, prefill
at batch 1 and batch B), then replays the spec's exact request list through two schedules that pay
only those forward costs, no serving, scheduling or Python overhead:
- static: batches of B in arrival order, each prompt padded to its batch's longest, each batch
  decoding until its longest output ends (what `model.generate` does);
- ideal continuous: B slots, a request's prompt computed at the bare batch-1 rate when it joins,
  every step decoding all running requests at the bare rate of that batch size.
Their ratio is the most continuous batching can gain over static batching on this hardware; each
schedule's output throughput is the bound a real system of that kind approaches.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from benchmarks.bounds.dense_bound import measure
from benchmarks.serve import make_workload, parse_args
from benchmarks.workloads.datasets import SampleRequest


def _prefill_seconds_per_token(model_dir: str, batch_size: int, prompt_len: int, num_threads: int) -> float:
    """Bare prefill time per prompt token at `batch_size` equal prompts (logits of the last token only)."""
    import torch
    from transformers import AutoModelForCausalLM

    if num_threads:
        torch.set_num_threads(num_threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = int(model.config.get_text_config().vocab_size)
    ids = torch.randint(3, vocab, (batch_size, prompt_len), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model(input_ids=ids, logits_to_keep=1)  # warm-up
        start = time.perf_counter()
        for _ in range(3):
            model(input_ids=ids, logits_to_keep=1)
    return (time.perf_counter() - start) / (3 * batch_size * prompt_len)


def static_seconds(
    requests: list[SampleRequest], batch: int, step_s: dict[int, float], prefill_b: float
) -> float:
    total = 0.0
    for i in range(0, len(requests), batch):
        group = requests[i : i + batch]
        total += len(group) * max(r.prompt_len for r in group) * prefill_b
        total += max(r.output_len for r in group) * step_s[len(group)]
    return total


def continuous_seconds(
    requests: list[SampleRequest], batch: int, step_s: dict[int, float], prefill_1: float
) -> float:
    """B slots; a finished request's slot goes to the next in arrival order at the next step."""
    pending = list(requests)
    running: list[int] = []  # tokens each running request still has to generate
    total = 0.0
    while pending or running:
        while pending and len(running) < batch:
            joined = pending.pop(0)
            total += joined.prompt_len * prefill_1  # its prompt; the prefill yields its first token
            if joined.output_len > 1:
                running.append(joined.output_len - 1)
        if running:
            total += step_s[len(running)]
            running = [left - 1 for left in running if left > 1]
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bounds.ideal", description=__doc__)
    parser.add_argument("--spec", required=True, help="a compare spec: its model and request list")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context-len", type=int, default=176, help="mean context of the timed decodes")
    parser.add_argument("--num-threads", type=int, default=2)
    args = parser.parse_args(argv)
    spec_args, _ = parse_args(["compare", "--spec", args.spec])
    requests = make_workload(spec_args).requests
    model = spec_args.model
    # Decode step time is close to linear in the batch size; measure a few sizes and interpolate.
    sizes = sorted({1, max(args.batch_size // 4, 1), max(args.batch_size // 2, 1), args.batch_size})
    measured = {
        b: measure(model, b, args.context_len, 16, args.num_threads)["ms_per_step"] / 1000 for b in sizes
    }
    step_s = {
        b: float(np.interp(b, sizes, [measured[s] for s in sizes])) for b in range(1, args.batch_size + 1)
    }
    mean_prompt = round(sum(r.prompt_len for r in requests) / len(requests))
    prefill_1 = _prefill_seconds_per_token(model, 1, mean_prompt, args.num_threads)
    prefill_b = _prefill_seconds_per_token(model, args.batch_size, mean_prompt, args.num_threads)
    outputs = sum(r.output_len for r in requests)
    static = static_seconds(requests, args.batch_size, step_s, prefill_b)
    continuous = continuous_seconds(requests, args.batch_size, step_s, prefill_1)
    result: dict[str, Any] = {
        "model": model,
        "requests": len(requests),
        "prompt_tokens": sum(r.prompt_len for r in requests),
        "output_tokens": outputs,
        "decode_ms_per_step": {b: round(1000 * measured[b], 2) for b in sizes},
        "prefill_tokens_per_s": {"batch_1": 1 / prefill_1, f"batch_{args.batch_size}": 1 / prefill_b},
        "static_s": static,
        "static_output_tokens_per_s": outputs / static,
        "ideal_continuous_s": continuous,
        "ideal_continuous_output_tokens_per_s": outputs / continuous,
        "ideal_ratio": static / continuous,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
