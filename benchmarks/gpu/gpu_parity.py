"""Greedy parity of the worker against transformers' `generate`, on any device and dtype.

    python -m benchmarks.gpu.gpu_parity --model models/demo --device cuda --dtype float32
    python -m benchmarks.gpu.gpu_parity --model models/demo --device cuda --dtype bfloat16

The in-process engine (`LLMEngine`: the batcher's Scheduler and the worker's ModelRunner) runs in this
process (chunked prefill under a small token budget, then batched decodes, as the pipeline runs
them); each request is then generated alone by transformers with its default attention, on the same
device in the same dtype. fp32 must agree token for token; in bf16 the two sum in different orders,
so a near-tie can flip and the continuation diverges from there: the report gives the share of
identical requests and where the others first differ. Use a trained model (the shipped demo model):
random weights are all near-ties.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from batcher.core.scheduler import SchedulerConfig
from common.protocol import SamplingParams, TokenEvent


def pipeline_greedy(
    model: str, device: str, dtype: str, prompts: list[list[int]], max_tokens: int, env: dict[str, str]
) -> list[list[int]]:
    from cbserve.offline.engine import LLMEngine
    from gpu_worker.settings import WorkerSettings

    settings = WorkerSettings(model=model, device=device, dtype=dtype, **env)  # type: ignore[arg-type]
    # A budget below the longest prompt makes later prompt chunks read earlier ones from the pool.
    engine = LLMEngine.load(settings, SchedulerConfig(max_num_seqs=len(prompts), max_num_batched_tokens=96))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"p{i}", prompt, params)
    outputs: dict[str, list[int]] = {f"p{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        step = engine.step()
        assert step.ran, "nothing to schedule before every request finished"
        failed = [(req.req_id, req.error) for req in step.finished if req.finish_reason == "error"]
        assert not failed, failed
        for event in step.events:
            if isinstance(event, TokenEvent):
                outputs[event.req_id].append(event.token_id)
    return [outputs[f"p{i}"] for i in range(len(prompts))]


def reference_greedy(
    model_dir: str | Path,
    prompts: list[list[int]],
    max_tokens: int | list[int],
    device: str = "cpu",
    dtype: str = "float32",
) -> list[list[int]]:
    """transformers' `generate`, one prompt at a time, greedy with EOS ignored (as `ignore_eos` asks
    the server): what the worker's greedy output must equal. `max_tokens`: one for all, or one each."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    model.to(torch.device(device))  # type: ignore[arg-type]  # nn.Module.to behind a decorator mypy misreads
    model.eval()
    return generate_greedy(model, prompts, max_tokens, device)


def generate_greedy(
    model: Any, prompts: Sequence[list[int]], max_tokens: int | Sequence[int], device: str = "cpu"
) -> list[list[int]]:
    """`model.generate` (transformers', or a PEFT model's) for each prompt alone, greedy, EOS ignored."""
    lengths = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    outputs = []
    for prompt, num_tokens in zip(prompts, lengths, strict=True):
        ids = torch.tensor([prompt], device=device)
        # eos_token_id=None as a keyword is what turns EOS off (a GenerationConfig would refill it).
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=num_tokens,
            eos_token_id=None,
            pad_token_id=0,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


def compare(ours: list[list[int]], reference: list[list[int]]) -> dict[str, object]:
    divergences = []
    for a, b in zip(ours, reference, strict=True):
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        divergences.append(first)
    identical = sum(1 for d in divergences if d is None)
    return {
        "requests": len(ours),
        "identical": identical,
        "identical_share": identical / len(ours),
        "first_divergence": [d for d in divergences if d is not None],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.gpu_parity", description=__doc__)
    parser.add_argument("--model", default="models/demo")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--env", default="", help="extra worker settings, e.g. cuda_graphs=false")
    parser.add_argument("--result-file", type=Path)
    args = parser.parse_args(argv)
    if args.device == "cuda":
        # TF32 matmuls would make fp32 a different arithmetic from the reference's.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    vocab = int(json.loads((Path(args.model) / "config.json").read_text())["vocab_size"])
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(
            3, vocab, (int(torch.randint(4, 200, (1,), generator=generator)),), generator=generator
        ).tolist()
        for _ in range(args.num_prompts)
    ]
    env = dict(kv.split("=", 1) for kv in args.env.split(",") if kv)
    ours = pipeline_greedy(args.model, args.device, args.dtype, prompts, args.max_tokens, env)
    reference = reference_greedy(args.model, prompts, args.max_tokens, args.device, args.dtype)
    summary = {"model": args.model, "device": args.device, "dtype": args.dtype, "worker": env}
    summary |= compare(ours, reference)
    print(json.dumps(summary))
    if args.result_file:
        args.result_file.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
