"""torch.compile (inductor) over the decoder's forward, compiled once and loaded by later workers,
eager when it fails.

One graph for every step: the token and row counts are unbacked symbols, so neither 1 nor 0 gets a
graph of its own, and paged attention is an opaque custom op, so the step's metadata never reaches
the graph. Inductor fuses the norms, RoPE, residuals and SiLU·mul (C++ kernels on the CPU, Triton on
CUDA). On the CPU the code calling those kernels is C++ too (inductor's cpp_wrapper): calling them
from Python cost ~0.7 ms a step at batch 1 on a small model (docs/benchmarks.md). The compiled
forward is a file in `cache_dir` (precompiled.py), compiled while the model loads when there is none
and loaded by every later worker. Where that fails, the forward is compiled at its first call (the
runner's profiling step) through inductor's caches in `cache_dir`; a failure there leaves the model
eager, with a warning.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.forward.precompiled import PrecompiledForward, mark_unbacked
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

# (input_ids, positions, kept rows, K pools, V pools[, lora_ids]) -> logits: Decoder.logits_of's inputs.
Forward = Callable[..., torch.Tensor]


def configure_cache(cache_dir: Path) -> None:
    """Inductor's on-disk caches under `cache_dir` (read when the first graph compiles)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    torch._inductor.config.fx_graph_cache = True


def inductor_options(device: torch.device) -> dict[str, Any] | None:
    return {"cpp_wrapper": True} if device.type == "cpu" else None


class CompiledForward:
    """`decoder.run` while compiled: the compiled forward, falling back to eager if the first call
    fails to compile. After that, errors propagate (they belong to the step, not to compilation)."""

    def __init__(
        self, decoder: Decoder, device: torch.device, backend: str | Callable[..., Any] = "inductor"
    ) -> None:
        self.decoder = decoder
        options = inductor_options(device) if backend == "inductor" else None
        self.compiled: Forward = torch.compile(
            decoder.logits_of, dynamic=True, backend=backend, options=options
        )
        self.compile_seconds = 0.0  # set by the first call, which compiles

    def __call__(self, *inputs: Any) -> torch.Tensor:
        mark_unbacked(inputs)
        if self.compile_seconds:
            return self.compiled(*inputs)
        started = time.perf_counter()  # the first call compiles (the runner's profiling step)
        try:
            # Floats (eps, scales) as constants: a symbolic float made dynamo trace everything twice.
            with torch._dynamo.config.patch(specialize_float=True):
                logits = self.compiled(*inputs)
        except Exception as exc:
            logger.warning("torch.compile failed, running eager: %s: %s", type(exc).__name__, exc)
            self.decoder.run = self.decoder.logits_of
            return self.decoder.logits_of(*inputs)
        self.compile_seconds = time.perf_counter() - started
        logger.info("compiled the forward in %.1f s (cache: %s)", self.compile_seconds, _cache_dir())
        return logits


def _cache_dir() -> str:
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR", "inductor's default")


def pool_layout(settings: WorkerSettings) -> tuple[int, torch.dtype]:
    """The block size and dtype of the KV pools the worker will allocate (`Decoder.pool_layout`)."""
    return settings.block_size, getattr(torch, settings.resolved_kv_cache_dtype)


def compile_decoder(
    decoder: Decoder, cache_dir: Path, device: torch.device, backend: str | Callable[..., Any] = "inductor"
) -> None:
    """`decoder.run` compiled: from its file in `cache_dir`, else at its first call, else eager."""
    configure_cache(cache_dir)
    try:
        decoder.run = PrecompiledForward(decoder, device, cache_dir, inductor_options(device), backend)
    except Exception as exc:
        logger.warning(
            "cannot compile the forward ahead (%s: %s): compiling at its first call", type(exc).__name__, exc
        )
        decoder.run = CompiledForward(decoder, device, backend)
