"""Test and benchmark stand-ins for a step's forward and sampling, chosen once at start-up.

`WORKER_NULL_MODEL` (benchmarks: time the control plane; with `WORKER_NULL_MODEL_STEP_MS`, a
device's time per step, during which the host is free as a GPU leaves it) and
`WORKER_FAIL_ON_TOKEN_ID` (tests: a poison input) replace or wrap the runner's sampling function
when the runner is built, so the hot step pays nothing for them when they are off.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from gpu_worker.runner.input_batch import InputBatch
from gpu_worker.runner.step.sampling import LaunchedSample, SampledStep
from gpu_worker.settings import WorkerSettings

# What a step runs on a non-empty batch: one sampled token per request that samples.
SampleStep = Callable[[InputBatch], LaunchedSample]


def null_sample(batch: InputBatch) -> LaunchedSample:
    """Token 0 for every request that samples, without a forward: the step still builds its inputs."""
    return LaunchedSample.read(SampledStep([0] * len(batch.sampling_reqs), {}, {}, {}))


def null_device(step_s: float) -> SampleStep:
    """`null_sample` from a device that runs one step at a time, `step_s` each, beside the host: a
    step's tokens are ready `step_s` after the later of its launch and the previous step's end."""
    ready_at = 0.0

    def sample(batch: InputBatch) -> LaunchedSample:
        nonlocal ready_at
        ready_at = max(ready_at, time.perf_counter()) + step_s
        done_at = ready_at
        step = SampledStep([0] * len(batch.sampling_reqs), {}, {}, {})

        def wait() -> None:
            time.sleep(max(0.0, done_at - time.perf_counter()))

        def result() -> SampledStep:
            wait()
            return step

        tokens = torch.zeros(len(batch.sampling_reqs), dtype=torch.long, device=batch.input_ids.device)
        return LaunchedSample(tokens, lambda: time.perf_counter() >= done_at, wait, result)

    return sample


def failing_on(token_id: int, sample: SampleStep) -> SampleStep:
    """`sample`, but raising while any scheduled request holds `token_id`, as a poison input would."""

    def sample_or_raise(batch: InputBatch) -> LaunchedSample:
        # The step's inputs too: a decode's input may be a token the host has not read yet.
        held = any(token_id in r.state.token_ids for r in batch.scheduled)
        if held or bool((batch.input_ids == token_id).any()):
            raise RuntimeError(f"fail_on_token_id: token {token_id} is in the batch")
        return sample(batch)

    return sample_or_raise


def with_step_hooks(settings: WorkerSettings, sample: SampleStep) -> SampleStep:
    """The sampling function a runner with these settings uses: `sample` unless a hook is set."""
    chosen = sample
    if settings.null_model:
        step_s = settings.null_model_step_ms / 1000
        chosen = null_device(step_s) if step_s > 0 else null_sample
    if settings.fail_on_token_id is not None:
        chosen = failing_on(settings.fail_on_token_id, chosen)
    return chosen
