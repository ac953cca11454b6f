"""`LLM(...)`'s arguments (vLLM's names) as the worker's and the batcher's settings, or refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from batcher.core.scheduler import SchedulerConfig
from cbserve.launcher import LaunchError, resolve_model
from gpu_worker.settings import WorkerSettings

# vLLM's arguments that have no counterpart here, each with the value that asks for what runs anyway.
NEUTRAL: dict[str, Any] = {
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
    "trust_remote_code": False,  # the worker loads architectures transformers ships, never hub code
    "revision": None,
    "tokenizer_revision": None,
    "tokenizer_mode": "auto",
    "skip_tokenizer_init": False,
    "cpu_offload_gb": 0,
    "enable_chunked_prefill": True,  # the scheduler always splits a long prompt under the token budget
    "speculative_config": None,
}
# The settings `enforce_eager` turns off (vLLM: no torch.compile, no CUDA graphs).
_EAGER = {"compile": False, "cuda_graphs": False}


def refuse_unsupported(kwargs: Mapping[str, Any]) -> None:
    for name, value in kwargs.items():
        if name not in NEUTRAL:
            raise TypeError(f"LLM() got an unexpected keyword argument {name!r}")
        if value != NEUTRAL[name]:
            raise ValueError(
                f"LLM({name}={value!r}) is not supported: the engine runs as if {name}={NEUTRAL[name]!r}"
            )


def model_directory(model: str) -> Path:
    """A model directory, or a hub id fetched as one (as `cbserve up` does: the tokenizer needs files)."""
    try:
        return resolve_model(model)
    except LaunchError as exc:
        raise ValueError(str(exc)) from None


def worker_settings(
    model_dir: Path, device: str, options: Mapping[str, Any], enforce_eager: bool
) -> WorkerSettings:
    """What `python -m gpu_worker` would run with; `options`: LLM's arguments named as the worker's
    settings, None for the worker's default (WORKER_* variables apply as they do to a worker)."""
    given: dict[str, Any] = {name: value for name, value in options.items() if value is not None}
    given["device"] = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if enforce_eager:
        given.update(_EAGER)
    try:
        return WorkerSettings(model=str(model_dir), **given)
    except ValidationError as exc:
        raise ValueError(_explain(exc)) from None


def scheduler_config(enable_prefix_caching: bool, async_scheduling: bool = False) -> SchedulerConfig:
    """The batcher's defaults (docs/settings.md), its caps left to the runner's registered limits."""
    return SchedulerConfig(enable_prefix_caching=enable_prefix_caching, async_scheduling=async_scheduling)


def _explain(exc: ValidationError) -> str:
    lines = ["invalid LLM arguments:"]
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:  # a rule across settings: its message names them
            lines.append(f"  {message}")
            continue
        name = str(error["loc"][0])
        name = "enforce_eager" if name in _EAGER else name
        lines.append(f"  {name}={error.get('input')!r}: {message}")
    return "\n".join(lines)
