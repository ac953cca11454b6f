"""The dense-forward bound: a bare batched greedy decode with no scheduling, serving or paging at all.

    python -m benchmarks.bounds.dense_bound --model models/gpt2-small-llama --batch-size 16 --context-len 176

transformers' own forward with a DynamicCache over one equal-length batch: prefill once (not timed),
then `--steps` single-token decode steps, timed. The output token throughput of any server running
the same model at the same batch size and context lengths can at best approach this.

A server also computes every prompt, which the decode-only bound leaves out. With
`--workload-prompt-tokens P --workload-output-tokens O` (a workload's totals) it also times bare
single-prompt prefills of `--prompt-len` tokens and reports the workload bound: the output token
throughput of a machine that spends exactly the bare forward's time on the P prompt tokens and on
O decodes at this batch size, O / (P / prefill rate + O / decode rate).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def measure(
    model_dir: str,
    batch_size: int,
    context_len: int,
    steps: int,
    num_threads: int,
    device: str = "cpu",
    dtype: str = "float32",
    prompt_len_for_prefill: int = 144,
) -> dict[str, Any]:
    import inspect

    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    if num_threads:
        torch.set_num_threads(num_threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)  # type: ignore[arg-type]  # decorated `.to` confuses mypy
    model.eval()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    vocab = int(model.config.get_text_config().vocab_size)
    generator = torch.Generator().manual_seed(0)
    # The timed decodes start halfway into the context, so their mean context is `context_len`.
    prompt_len = max(context_len - steps // 2, 1)
    input_ids = torch.randint(3, vocab, (batch_size, prompt_len), generator=generator).to(device)
    # transformers 5 renamed `past_key_values` to `cache` (the old name warns).
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache()
    with torch.inference_mode():
        out = model(input_ids=input_ids, use_cache=True, **{key: cache})
        tokens = out.logits[:, -1].argmax(-1, keepdim=True)
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=tokens, use_cache=True, **{key: cache})
            tokens = out.logits[:, -1].argmax(-1, keepdim=True)
        sync()
        elapsed = time.perf_counter() - start
        prefill_tokens_per_s = _prefill_rate(model, vocab, prompt_len_for_prefill, device, sync, generator)
    decode_tokens_per_s = batch_size * steps / elapsed
    return {
        "device": device,
        "dtype": dtype,
        "batch_size": batch_size,
        "mean_context_len": prompt_len + steps / 2,
        "steps": steps,
        "ms_per_step": 1000 * elapsed / steps,
        "output_tokens_per_s": decode_tokens_per_s,
        "prefill_tokens_per_s": prefill_tokens_per_s,
    }


def _prefill_rate(model: Any, vocab: int, prompt_len: int, device: str, sync: Any, generator: Any) -> float:
    """Prompt tokens per second of bare single-prompt forwards (no padding, no cache reuse)."""
    import torch

    prompts = [torch.randint(3, vocab, (1, prompt_len), generator=generator).to(device) for _ in range(6)]
    with torch.inference_mode():
        model(input_ids=prompts[0], logits_to_keep=1)  # warm-up; a server needs only the last logits
        sync()
        start = time.perf_counter()
        for ids in prompts[1:]:
            model(input_ids=ids, logits_to_keep=1)
        sync()
    return (len(prompts) - 1) * prompt_len / (time.perf_counter() - start)


def workload_bound(result: dict[str, Any], prompt_tokens: int, output_tokens: int) -> float:
    """Output tokens per second if the workload's prompts and decodes ran at the bare forward's rates."""
    seconds = prompt_tokens / result["prefill_tokens_per_s"] + output_tokens / result["output_tokens_per_s"]
    return output_tokens / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bounds.dense_bound", description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context-len", type=int, default=176, help="mean context of the timed decodes")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--num-threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--prompt-len", type=int, default=144, help="prompt length of the timed prefills")
    parser.add_argument("--workload-prompt-tokens", type=int, default=0, help="a workload's prompt tokens")
    parser.add_argument("--workload-output-tokens", type=int, default=0, help="its output tokens")
    args = parser.parse_args(argv)
    result = measure(
        args.model,
        args.batch_size,
        args.context_len,
        args.steps,
        args.num_threads,
        args.device,
        args.dtype,
        args.prompt_len,
    )
    if args.workload_output_tokens:
        result["workload_bound_output_tokens_per_s"] = workload_bound(
            result, args.workload_prompt_tokens, args.workload_output_tokens
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
