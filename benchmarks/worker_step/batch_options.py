"""The command-line options the in-process step benchmarks share (profile_step.py, forward_ab.py): the
model, a batch of greedy requests with random prompts, and the engine's sizes."""

from __future__ import annotations

import argparse


def add_batch_options(parser: argparse.ArgumentParser, *, decode_steps: int, num_threads: int) -> None:
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=144)
    parser.add_argument("--decode-steps", type=int, default=decode_steps)
    parser.add_argument("--num-threads", type=int, default=num_threads)
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
