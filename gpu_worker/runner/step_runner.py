"""What drives one worker's steps, whichever runner it is (the service shell and the offline engine
take any of them): `ModelRunner` generates; under `WORKER_RUNNER=pooling` a causal model's
`PoolingModelRunner` or an encoder's `EncoderRunner` (pooling/) answers pooling requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from common.protocol import ModelRunnerOutput, SchedulerOutput, WorkerEvent, WorkerInfo
from gpu_worker.runner.step.launched import StepHandle
from gpu_worker.settings import WorkerSettings


class StepRunner(Protocol):
    worker_id: str  # rewritten when the worker rejoins under a new id
    model_name: str
    num_blocks: int
    block_size: int
    max_model_len: int

    def worker_info(self) -> WorkerInfo: ...

    def launch(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Queue a step; its handle gives its output and events, waiting for the device if need be."""
        ...

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """A step launched and finished; `token_events` gives its events until the next step."""
        ...

    def token_events(self, output: ModelRunnerOutput) -> Sequence[WorkerEvent]: ...

    def reset(self) -> None: ...


def make_runner(settings: WorkerSettings) -> StepRunner:
    """The runner `settings` (and, on auto, the model's own files) call for."""
    # Imported here: only a pooling worker loads the pooling runners' modules.
    from gpu_worker.runner.model_runner import ModelRunner
    from gpu_worker.runner.pooling.model_files import read_pooling_spec, resolve_runner

    if resolve_runner(settings) == "generate":
        return ModelRunner(settings)
    spec = read_pooling_spec(settings)
    if spec.encoder:
        from gpu_worker.runner.pooling.encoder_runner import EncoderRunner

        return EncoderRunner(settings, spec)
    from gpu_worker.runner.pooling.causal_runner import PoolingModelRunner

    return PoolingModelRunner(settings, spec)
