"""Where one worker step's time goes: the in-process engine (`LLMEngine`: the scheduler and the
ModelRunner, cbserve/offline/engine.py) under a profiler.

    python -m benchmarks.worker_step.profile_step --model models/gpt2-small-llama --num-requests 16 \
        --prompt-len 144

Submits `--num-requests` requests (random prompt ids, `--output-len` tokens each, greedy), schedules
and runs steps until every request has finished its prompt (the prefill phase), then times
`--decode-steps` pure decode steps. For each phase it prints the wall time per step, how many torch
operators one step dispatches (each one a kernel launch on a GPU, where launch latency rather than
arithmetic bounds a small model), and the operators and Python functions that take the time.

`--ab-group-decodes ROUNDS` times instead of profiling: decode rounds alternating the worker's two
decode-attention layouts (WORKER_GROUP_DECODES on and off) on the same requests, so that a change
is measured in one process, free of the machine's drift between runs (`--output-len` must cover
ROUNDS x `--decode-steps`):

    python -m benchmarks.worker_step.profile_step --model models/gpt2-small-llama --num-requests 16 \
        --prompt-len 32 --prompt-len-max 600 --output-len 200 --decode-steps 8 --num-threads 2 \
        --kv-cache-mb 1024 --ab-group-decodes 10

`--ab-cascade ROUNDS` alternates cascade attention on and off (WORKER_CASCADE_ATTENTION) the same
way; `--num-prefixes K --prefix-len N` starts every prompt with one of K shared N-token prefixes, so
that the prefix cache hands the same blocks to several requests (the prefix_repetition load):

    python -m benchmarks.worker_step.profile_step --model models/gpt2-small-llama --num-requests 16 \
        --prompt-len 64 --num-prefixes 8 --prefix-len 1024 --output-len 200 --decode-steps 8 --num-threads 2 \
        --kv-cache-mb 2048 --ab-cascade 10
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from batcher.core.scheduler import SchedulerConfig
from benchmarks.worker_step.batch_options import add_batch_options
from cbserve.offline.engine import LLMEngine
from common.protocol import SamplingParams
from gpu_worker.runner.attention.torch_attn import TorchAttentionBackend
from gpu_worker.settings import WorkerSettings


def _engine(args: argparse.Namespace) -> LLMEngine:
    settings = WorkerSettings(
        model=args.model,
        device=args.device,
        num_threads=args.num_threads or None,
        kv_cache_memory_mb=args.kv_cache_mb,
        max_num_seqs=args.num_requests,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    engine = LLMEngine.load(settings, SchedulerConfig())
    generator = torch.Generator().manual_seed(0)
    longest = max(args.prompt_len, args.prompt_len_max)
    prefixes = [
        torch.randint(3, 1000, (args.prefix_len,), generator=generator).tolist()
        for _ in range(args.num_prefixes)
    ]
    for i in range(args.num_requests):
        length = int(torch.randint(args.prompt_len, longest + 1, (1,), generator=generator))
        prefix = prefixes[i % len(prefixes)] if prefixes else []
        prompt = prefix + torch.randint(3, 1000, (length,), generator=generator).tolist()
        params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
        engine.add_request(f"r{i}", prompt, params)
    return engine


def _step(engine: LLMEngine) -> None:
    """One schedule + forward + update."""
    assert engine.step().ran, "nothing to schedule"


def _report(title: str, run: Callable[[], int], top: int) -> None:
    """Runs `run` (which returns how many steps it ran) under torch's profiler and prints a summary."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sync()
        start = time.perf_counter()
        steps = run()
        sync()
        elapsed = time.perf_counter() - start
    events = prof.key_averages()
    num_ops = sum(e.count for e in events if e.key.startswith("aten::") and e.cpu_parent is None)
    print(f"\n=== {title}: {steps} steps, {1000 * elapsed / steps:.2f} ms/step (under the profiler)")
    print(f"aten operators dispatched per step (top level): {num_ops / steps:.0f}")
    print(events.table(sort_by="self_cpu_time_total", row_limit=top))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.worker_step.profile_step", description=__doc__
    )
    add_batch_options(parser, decode_steps=16, num_threads=0)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--prompt-len-max", type=int, default=0, help="prompts uniform in [--prompt-len, this] (seeded)"
    )
    parser.add_argument("--num-prefixes", type=int, default=0, help="shared prompt prefixes (0: none)")
    parser.add_argument("--prefix-len", type=int, default=0, help="tokens of each shared prefix")
    parser.add_argument("--top", type=int, default=15, help="rows of each table")
    parser.add_argument(
        "--ab-group-decodes",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead of profiling: after the prefill, alternate ROUNDS rounds of --decode-steps steps "
        "with decodes attended in length groups and in one group, and print ms per step of each",
    )
    parser.add_argument(
        "--ab-cascade",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="as --ab-group-decodes, alternating cascade attention on and off",
    )
    args = parser.parse_args(argv)
    engine = _engine(args)

    def prefill() -> int:
        steps = 0
        while engine.has_prompts_to_compute():
            _step(engine)
            steps += 1
        return steps

    def decode() -> int:
        for _ in range(args.decode_steps):
            _step(engine)
        return args.decode_steps

    if args.ab_group_decodes or args.ab_cascade:
        prefill()
        if args.ab_group_decodes:
            labels = ("decodes in length groups", "decodes in one group")
            _ab(engine, decode, args.ab_group_decodes, "group_decodes", labels)
        else:
            _ab(engine, decode, args.ab_cascade, "cascade", ("cascade attention", "per-decode attention"))
        return
    _report("prefill phase (prompt chunks, decodes of the requests already admitted)", prefill, args.top)
    _report("decode steps", decode, args.top)
    profiler = cProfile.Profile()
    profiler.enable()
    decode()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
    print("\n=== Python functions by own time (decode steps, cProfile)")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


def _ab(
    engine: LLMEngine, decode: Callable[[], int], rounds: int, switch: str, labels: tuple[str, str]
) -> None:
    """Same process, same requests, rounds alternating the torch backend's `switch` on and off: the
    contexts grow evenly under both."""
    backend = getattr(engine.runner, "attn_backend", None)  # a generating runner's
    if not isinstance(backend, TorchAttentionBackend):
        raise SystemExit("the A/B options compare the torch backend's layouts (WORKER_ATTENTION_BACKEND)")
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds):
        setattr(backend, switch, i % 2 == 0)
        start = time.perf_counter()
        steps = decode()
        times[i % 2 == 0].append(1000 * (time.perf_counter() - start) / steps)
    width = max(map(len, labels))
    for on, ms in times.items():
        rows = " ".join(f"{t:.1f}" for t in ms)
        label = labels[0] if on else labels[1]
        print(f"{label:<{width}}: ms/step by round {rows}; median {statistics.median(ms):.1f}")


if __name__ == "__main__":
    main()
