"""Embedding throughput, side by side in one process: the pipeline's `LLM(runner="pooling").embed`
against sentence-transformers' own `SentenceTransformer.encode`, on the same model and inputs, in
prompt tokens per second (best of `--repeat` rounds, each after a warm-up), and their agreement (the
lowest cosine between the two vectors of an input).

    python -m benchmarks.baselines.embed_throughput --make bert        # a MiniLM-sized random BERT
    python -m benchmarks.baselines.embed_throughput --make qwen        # a small random Qwen2, last token
    python -m benchmarks.baselines.embed_throughput --model PATH       # any sentence-transformers model

docs/benchmarks.md records what it printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# Sizes of the random models `--make` builds: MiniLM-L6's shape, and a small decoder.
SIZES: dict[str, dict[str, int]] = {
    "bert": {
        "hidden_size": 384,
        "num_hidden_layers": 6,
        "num_attention_heads": 12,
        "intermediate_size": 1536,
    },
    "qwen": {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 1408},
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.baselines.embed_throughput", description=__doc__
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a sentence-transformers model directory")
    source.add_argument("--make", choices=sorted(SIZES), help="build a random model of this shape")
    parser.add_argument("--num-inputs", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="sentence-transformers' encode batch")
    parser.add_argument("--max-num-batched-tokens", type=int, default=4096, help="the pipeline's step budget")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the result here")
    return parser.parse_args(argv)


def build(kind: str, path: Path) -> Path:
    """A random model of `SIZES[kind]`, saved as sentence-transformers saves one."""
    from harness.models import pooling_models

    if kind == "bert":
        return pooling_models.build_bert_embedder(path, sizes=SIZES[kind], max_len=512)
    return pooling_models.build_decoder_embedder(path, sizes=SIZES[kind])


def best_rate(run: Callable[[], Any], num_tokens: int, repeat: int) -> float:
    """Tokens per second of the fastest of `repeat` runs."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return num_tokens / best


def measure(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    from cbserve import LLM
    from harness.models.pooling_models import sentences

    texts = sentences(args.num_inputs)
    llm = LLM(
        str(model_dir),
        runner="pooling",
        device=args.device,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
    )
    st = SentenceTransformer(str(model_dir), device=args.device)
    outputs = llm.embed(texts, use_tqdm=False)  # the warm-up, and the vectors compared
    ours = np.array([out.outputs.embedding for out in outputs])
    ref = st.encode(texts, batch_size=args.batch_size)
    cosine = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    num_tokens = sum(len(out.prompt_token_ids) for out in outputs)
    st_rate = best_rate(lambda: st.encode(texts, batch_size=args.batch_size), num_tokens, args.repeat)
    our_rate = best_rate(lambda: llm.embed(texts, use_tqdm=False), num_tokens, args.repeat)
    return {
        "model": str(args.make or args.model),
        "num_inputs": len(texts),
        "num_tokens": num_tokens,
        "sentence_transformers_tokens_per_s": round(st_rate),
        "cbserve_tokens_per_s": round(our_rate),
        "ratio": round(our_rate / st_rate, 2),
        "min_cosine": float(cosine.min()),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model if args.model is not None else build(args.make, Path(tmp) / args.make)
        result = measure(model_dir, args)
    print(f"{result['model']}: {result['num_inputs']} inputs, {result['num_tokens']} tokens")
    print(f"  sentence-transformers encode  {result['sentence_transformers_tokens_per_s']:>9} tokens/s")
    print(
        f"  cbserve LLM.embed             {result['cbserve_tokens_per_s']:>9} tokens/s  (x{result['ratio']})"
    )
    print(f"  lowest cosine between the two {result['min_cosine']:.7f}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
