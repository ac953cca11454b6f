"""Test and benchmark stand-ins for a step's forward and sampling, chosen once at start-up.

`WORKER_NULL_MODEL` (benchmarks: time the control plane) and `WORKER_FAIL_ON_TOKEN_ID` (tests: a
poison input) replace or wrap the runner's sampling function when the runner is built, so the hot
step pays nothing for them when they are off.
"""

from __future__ import annotations

from collections.abc import Callable

from gpu_worker.runner.input_batch import InputBatch
from gpu_worker.settings import WorkerSettings

# What a step runs on a non-empty batch: one sampled token per request that samples.
SampleStep = Callable[[InputBatch], list[int]]


def null_sample(batch: InputBatch) -> list[int]:
    """Token 0 for every request that samples, without a forward: the step still builds its inputs."""
    return [0] * len(batch.sampling_reqs)


def failing_on(token_id: int, sample: SampleStep) -> SampleStep:
    """`sample`, but raising while any scheduled request holds `token_id`, as a poison input would."""

    def sample_or_raise(batch: InputBatch) -> list[int]:
        if any(token_id in r.state.token_ids for r in batch.scheduled):
            raise RuntimeError(f"fail_on_token_id: token {token_id} is in the batch")
        return sample(batch)

    return sample_or_raise


def with_step_hooks(settings: WorkerSettings, sample: SampleStep) -> SampleStep:
    """The sampling function a runner with these settings uses: `sample` unless a hook is set."""
    chosen = null_sample if settings.null_model else sample
    if settings.fail_on_token_id is not None:
        chosen = failing_on(settings.fail_on_token_id, chosen)
    return chosen
