"""A launched step (vLLM's AsyncModelRunnerOutput): queued on the device, finished once the host
reads its tokens, so that the host can receive and prepare the next step while the device runs.

A runner finishes its steps in launch order: finishing one finishes every step launched before it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from common.protocol import ModelRunnerOutput, SchedulerOutput, WorkerEvent
from gpu_worker.runner.host_copies import PinnedRing
from gpu_worker.runner.input_batch import InputBatch
from gpu_worker.runner.step.sampling import LaunchedSample, SampledStep

# A sampled token the host has not read yet: the next step's input takes the token on the device.
PLACEHOLDER = -1


def take_device_tokens(
    batch: InputBatch, on_device: Mapping[str, tuple[torch.Tensor, int]], staging: PinnedRing
) -> None:
    """A request whose last token a step still on the device sampled decodes from its placeholder:
    copy that token into the batch's input ids on the device (`on_device`: req_id -> the step's
    sampled ids and the request's row in them). Nothing is read back."""
    if not on_device:
        return
    starts = batch.attn_metadata.common.query_start_loc_cpu.tolist()
    by_step: dict[int, tuple[torch.Tensor, list[int], list[int]]] = {}
    for req, start in zip(batch.scheduled, starts, strict=False):
        state = req.state
        source = on_device.get(state.req_id)
        if source is None or state.token_ids[state.num_computed_tokens] != PLACEHOLDER:
            continue
        tokens, row = source
        _, flat, rows = by_step.setdefault(id(tokens), (tokens, [], []))
        flat.append(start)
        rows.append(row)
    input_ids = batch.input_ids[0]
    for tokens, flat, rows in by_step.values():
        index = staging.to_device([*flat, *rows])
        input_ids.index_copy_(0, index[: len(flat)], tokens.index_select(0, index[len(flat) :]))


@dataclass(frozen=True, slots=True)
class FinishedStep:
    output: ModelRunnerOutput
    events: Sequence[WorkerEvent]  # what the worker publishes with it


@dataclass(slots=True)
class LaunchedStep:
    """What finishing a generating runner's step needs, kept from its launch."""

    scheduler_output: SchedulerOutput
    batch: InputBatch
    sample: LaunchedSample
    placeholders: list[int]  # per sampling request, where its token goes in its token_ids
    req_errors: dict[str, str]
    started: float  # perf_counter at launch
    encoder_counts: tuple[int, int] = (0, 0)  # the encoder cache's (runs, hits) before it
    overlapped: bool = False  # launched while an earlier step was still on the device


class StepHandle:
    """One launched step of a runner; `result()` waits for it (and for the steps before it)."""

    def __init__(self, sample: LaunchedSample, finish: Callable[[], FinishedStep]) -> None:
        self._sample = sample
        self._finish: Callable[[], FinishedStep] | None = finish
        self._result: FinishedStep | None = None

    @classmethod
    def finished(cls, result: FinishedStep) -> StepHandle:
        handle = cls(LaunchedSample.read(SampledStep([], {}, {}, {})), lambda: result)
        handle.result()
        return handle

    def ready(self) -> bool:
        """Whether `result()` would return without waiting on the device."""
        return self._result is not None or self._sample.done()

    def wait_ready(self) -> None:
        """Until `ready()`; from any thread (the worker's device watcher: service/step_inbox.py)."""
        self._sample.wait()

    def result(self) -> FinishedStep:
        if self._result is None:
            assert self._finish is not None
            finish, self._finish = self._finish, None
            self._result = finish()
        return self._result

    def get_output(self) -> ModelRunnerOutput:
        return self.result().output

    @property
    def events(self) -> Sequence[WorkerEvent]:
        return self.result().events


class LaunchedSteps:
    """A runner's steps launched and not yet finished, in launch order, and where each of their
    samples is on the device, by req_id, for the next step's inputs (`take_device_tokens`)."""

    def __init__(self, device: torch.device) -> None:
        self._handles: deque[StepHandle] = deque()
        self._on_device: dict[str, tuple[torch.Tensor, int]] = {}
        self._staging = PinnedRing(torch.long, device)  # the index copies of take_device_tokens

    def __bool__(self) -> bool:
        return bool(self._handles)

    def add(self, handle: StepHandle, batch: InputBatch, tokens: torch.Tensor) -> None:
        """A step left on the device: `tokens`, its samples, row i for `batch.sampling_reqs[i]`."""
        for row, req in enumerate(batch.sampling_reqs):
            self._on_device[req.state.req_id] = (tokens, row)
        self._handles.append(handle)

    def take_tokens(self, batch: InputBatch) -> None:
        take_device_tokens(batch, self._on_device, self._staging)

    def finish_before(self, handle: StepHandle) -> None:
        """Finish every step launched before `handle`'s (all of them, for a step never added), in
        order, and drop `handle` from those waiting."""
        while self._handles and self._handles[0] is not handle:
            self._handles[0].result()  # its finish comes back here and drops it
        if self._handles:
            self._handles.popleft()

    def finish_all(self) -> None:
        while self._handles:
            self._handles[0].result()

    def read(self, batch: InputBatch, tokens: torch.Tensor | None) -> None:
        """The host has read `tokens`, a finished step's samples: the next steps take them from it."""
        for req in batch.sampling_reqs if tokens is not None else ():
            source = self._on_device.get(req.state.req_id)
            if source is not None and source[0] is tokens:
                del self._on_device[req.state.req_id]
