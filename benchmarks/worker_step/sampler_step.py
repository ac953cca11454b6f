"""Time one sampler step: rows x vocab of random logits, mixed or plain-temperature parameters.

    python -m benchmarks.worker_step.sampler_step --rows 64 --vocab 32000 --device cpu

Mixed rows cycle through greedy, temperature, seeded, top-k, top-p, min-p, penalties (with a
600-token history) and logprobs. Prints one JSON line per batch kind: milliseconds per step.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from common.protocol import SamplingParams
from gpu_worker.runner.sample.sampler import Sampler
from gpu_worker.runner.sample.sampling_state import SamplingState

MIXED = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=0.7, top_k=50),
    SamplingParams(temperature=0.9, top_p=0.9, seed=2),
    SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=0.8, repetition_penalty=1.2, frequency_penalty=0.3),
    SamplingParams(temperature=0.0, logprobs=5),
]


def time_step(params: list[SamplingParams], vocab: int, device: torch.device, repeats: int) -> float:
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(len(params), vocab, generator=generator) * 3).to(device)
    state, sampler = SamplingState(vocab, device), Sampler(seed=0, device=device)
    req_ids = [f"r{i}" for i in range(len(params))]
    for req_id, p in zip(req_ids, params, strict=True):
        history = torch.randint(0, vocab, (600,), generator=generator).tolist()
        state.add(req_id, p, history[:500], history[500:])
    for _ in range(3):
        sampler.launch(logits, state, req_ids).output()  # warm-up; each call ends in its one host sync
    started = time.perf_counter()
    for _ in range(repeats):
        sampler.launch(logits, state, req_ids).output()
    return (time.perf_counter() - started) / repeats * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batches = {
        "mixed": [MIXED[i % len(MIXED)] for i in range(args.rows)],
        "temperature": [SamplingParams(temperature=0.8)] * args.rows,
        "greedy": [SamplingParams(temperature=0.0)] * args.rows,
    }
    for kind, params in batches.items():
        ms = time_step(params, args.vocab, device, args.repeats)
        print(
            json.dumps(
                {
                    "batch": kind,
                    "rows": args.rows,
                    "vocab": args.vocab,
                    "device": args.device,
                    "ms": round(ms, 3),
                }
            )
        )


if __name__ == "__main__":
    main()
