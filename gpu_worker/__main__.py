"""`python -m gpu_worker --model PATH [--device cpu|cuda]`: the only place settings are built."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType

import torch
from pydantic import ValidationError
from transformers.utils import logging as transformers_logging

from common.gc_tuning import tune_gc
from common.logging_setup import configure_logging
from gpu_worker.runner.step_runner import make_runner
from gpu_worker.service.worker import Worker
from gpu_worker.settings import WorkerSettings, explain_errors

logger = logging.getLogger("gpu_worker")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gpu_worker", description=__doc__)
    parser.add_argument("--model", help="model directory or hub id (overrides WORKER_MODEL / MODEL)")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="overrides WORKER_DEVICE")
    # vLLM's pooling flags: a chat model's own hidden states are served only when the operator asks.
    parser.add_argument(
        "--runner", choices=["auto", "generate", "pooling"], help="vLLM's --runner (WORKER_RUNNER)"
    )
    parser.add_argument(
        "--convert",
        choices=["auto", "embed", "classify"],
        help="vLLM's --convert: serve a causal LM as an embedding model or classifier (WORKER_CONVERT)",
    )
    # vLLM's LoRA flags.
    parser.add_argument(
        "--enable-lora", action="store_true", default=None, help="serve LoRA adapters (WORKER_ENABLE_LORA)"
    )
    parser.add_argument("--max-loras", type=int, help="adapters per step (WORKER_MAX_LORAS)")
    parser.add_argument("--max-lora-rank", type=int, help="highest adapter rank (WORKER_MAX_LORA_RANK)")
    parser.add_argument("--max-cpu-loras", type=int, help="adapters in host memory (WORKER_MAX_CPU_LORAS)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    transformers_logging.disable_progress_bar()  # one log line per start, not a weight-loading bar
    args = parse_args(argv)
    overrides = {name: value for name, value in vars(args).items() if value is not None}
    try:
        settings = WorkerSettings(**overrides)
    except ValidationError as exc:
        print(explain_errors(exc), file=sys.stderr)
        return 2
    configure_logging("gpu_worker", settings.log_format)
    # transformers writes through a handler of its own; route its records through ours instead.
    transformers_logging.disable_default_handler()
    transformers_logging.enable_propagation()
    if settings.num_threads is not None:
        torch.set_num_threads(settings.num_threads)
    try:
        runner = make_runner(settings)
    except ValueError as exc:  # sizing and device problems carry a message that says what to change
        print(f"cannot start worker: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # transformers' way of saying the model path or hub id does not resolve
        print(f"cannot load model {settings.model!r} (check --model / MODEL): {exc}", file=sys.stderr)
        return 2
    worker = Worker(settings, runner)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logger.info("received %s, stopping", signal.Signals(signum).name)
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tune_gc()  # the model is loaded: its modules and tensors are never walked again
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
