"""The worker's forward timed inside its steps, apart from the step's host time.

`ForwardTimer(runner)` wraps the runner's forward (`ModelRunner._forward`: a replayed CUDA graph for
decode-only steps, else the model's call, compiled or not) on that one runner. On a GPU each call is
bracketed by CUDA events on the current stream: the device's time from the forward's first launch
to its last kernel's end, gaps where the GPU waited on the host's launches included. On the CPU the
forward returns once computed, so perf_counter around the call is its time. `take()` gives the ms of
each forward since the last take; the step's other work (inputs, sampling, the token's trip to the
host) is the step's wall time less these.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


class ForwardTimer:
    def __init__(self, runner: Any) -> None:
        forward: Callable[[Any], torch.Tensor] = runner._forward
        self.device: torch.device = runner.device
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._ms: list[float] = []

        def timed(batch: Any) -> torch.Tensor:
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                logits = forward(batch)
                end.record()
                self._events.append((start, end))
                return logits
            started = time.perf_counter()
            logits = forward(batch)
            self._ms.append(1000 * (time.perf_counter() - started))
            return logits

        runner._forward = timed  # this runner only: its steps call self._forward

    def take(self) -> list[float]:
        """Milliseconds of each forward since the last call (waits for the GPU to finish them)."""
        for start, end in self._events:
            end.synchronize()
            self._ms.append(start.elapsed_time(end))
        self._events.clear()
        taken, self._ms = self._ms, []
        return taken
