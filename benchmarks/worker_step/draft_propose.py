"""What the worker's draft model (SPECULATIVE_CONFIG method draft_model) costs per step, in one process.

    python -m benchmarks.worker_step.draft_propose --model models/gpt2-small-llama \
        --draft-model models/draft-llama --num-requests 1,4,8,16 --num-drafts 4 --rounds 12

For each request count: that many requests with random prompts of --prompt-len (+7 per request)
tokens get their first drafts (their catch-up), then, --rounds times, one more known token each (a
step that accepted none of their drafts) and `--num-drafts` new drafts, all of them in one
proposal, as the worker asks after a step. Prints the median ms per proposal.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from transformers import AutoConfig

from gpu_worker.runner.spec_decode.draft_model import DraftModelProposer
from gpu_worker.settings import WorkerSettings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="the target (its settings and vocabulary)")
    parser.add_argument("--draft-model", required=True)
    parser.add_argument("--num-requests", default="1,4,8,16")
    parser.add_argument("--num-drafts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--num-blocks", type=int, default=2048)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.num_threads)
    vocab = int(AutoConfig.from_pretrained(args.model).get_text_config().vocab_size)
    draft_vocab = int(AutoConfig.from_pretrained(args.draft_model).get_text_config().vocab_size)
    settings = WorkerSettings(model=args.model, worker_id="bench", compile=args.compile)
    proposer = DraftModelProposer(settings, args.draft_model, vocab)
    proposer.use_kv_cache(args.num_blocks)
    rng = random.Random(0)
    for num_requests in (int(n) for n in args.num_requests.split(",")):
        contexts = {
            f"r{i}": [rng.randrange(draft_vocab) for _ in range(args.prompt_len + 7 * i)]
            for i in range(num_requests)
        }
        proposer.propose({i: (c, args.num_drafts) for i, c in contexts.items()})
        times = []
        for _ in range(args.rounds):
            for context in contexts.values():
                context.append(rng.randrange(draft_vocab))
            started = time.perf_counter()
            proposer.propose({i: (c, args.num_drafts) for i, c in contexts.items()})
            times.append(time.perf_counter() - started)
        for req_id in contexts:
            proposer.free(req_id)
        print(
            f"{num_requests:3d} requests x {args.num_drafts} drafts: "
            f"{statistics.median(times) * 1e3:.1f} ms per proposal "
            f"[{min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}]"
        )


if __name__ == "__main__":
    main()
