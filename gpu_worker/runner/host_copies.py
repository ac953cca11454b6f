"""Host-device copies of the step loop that never block the host (vLLM v1's CpuGpuBuffer idea).

- `CpuGpuBuffer`: a host tensor (pinned on CUDA) and its device twin, allocated once at their
  largest size; a step writes the used prefix on the host and copies it with one non-blocking copy.
  On the CPU the two are one tensor and nothing is copied.
- `PinnedRing`: pinned staging buffers used in turn, each with the event of the last copy that
  read or wrote it, so a buffer is never overwritten while a copy from it may still be in flight.
- `DeviceToHost`: device values (the sampled ids) copied into a pinned buffer on a side stream
  behind an event; the host waits on that event only when it reads them (`HostValues.tolist`),
  and only then is the buffer used again, however many copies are waiting to be read.

On the CPU every path reduces to the plain tensor (no copy, no event, no stream).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def pinned_empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host memory for copies to and from `device`: pinned on CUDA, so that a copy is queued on the
    stream instead of waiting for it to drain."""
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=device.type == "cuda")


def new_event(device: torch.device) -> Any:
    """An event on `device`'s streams; None on the CPU, where every copy is done when it returns."""
    return torch.cuda.Event() if device.type == "cuda" else None


def side_stream(device: torch.device) -> Any:
    return torch.cuda.Stream(device) if device.type == "cuda" else None


class CpuGpuBuffer:
    def __init__(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> None:
        self.cpu = pinned_empty(shape, dtype, device).zero_()
        self.np: np.ndarray[Any, Any] = self.cpu.numpy()
        self.gpu = self.cpu if device.type == "cpu" else torch.zeros_like(self.cpu, device=device)

    def copy_to_gpu(self, n: int) -> torch.Tensor:
        """The first `n` rows on the device, copied from the host without blocking it."""
        if self.gpu is self.cpu:
            return self.cpu[:n]
        return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)


class PinnedRing:
    """`depth` pinned 1-D buffers of `dtype` taken in turn (double-buffered by default)."""

    def __init__(self, dtype: torch.dtype, device: torch.device, depth: int = 2) -> None:
        self.dtype = dtype
        self.device = device
        self._buffers = [pinned_empty((0,), dtype, device) for _ in range(depth)]
        self._events: list[Any] = [None] * depth
        self._next = 0

    def take(self, n: int) -> tuple[int, torch.Tensor]:
        """The next buffer's first `n` items, free to write: the host waits, if at all, only for the
        copy that last used this buffer (two steps ago with the default depth)."""
        i = self._next
        self._next = (i + 1) % len(self._buffers)
        event = self._events[i]
        if event is not None:
            event.synchronize()
            self._events[i] = None
        if self._buffers[i].shape[0] < n:
            self._buffers[i] = pinned_empty((max(256, 2 * n),), self.dtype, self.device)
        return i, self._buffers[i][:n]

    def used_by_copy(self, i: int) -> Any:
        """Buffer `i` is read or written by a copy just queued on the current stream: its event."""
        event = self._events[i] = new_event(self.device)
        if event is not None:
            event.record()
        return event

    def to_device(self, values: Sequence[int] | np.ndarray[Any, Any]) -> torch.Tensor:
        """Host values (a list or numpy array) on the device: staged in the next buffer, copied
        without blocking."""
        if self.device.type == "cpu":
            return torch.tensor(values, dtype=self.dtype)
        i, staged = self.take(len(values))
        staged.numpy()[:] = values
        on_device = staged.to(self.device, non_blocking=True)
        self.used_by_copy(i)
        return on_device


class HostValues:
    """Device values on their way into pinned host memory; `tolist()` waits for them (only them)."""

    def __init__(self, host: torch.Tensor, ready: Any, release: Callable[[], None] | None = None) -> None:
        self.host = host
        self._ready = ready
        self._release = release  # hands the buffer back once read (DeviceToHost)

    def done(self) -> bool:
        """Whether the values are on the host already (the host would not wait for them)."""
        ready = self._ready  # read once: the reading thread may clear it meanwhile
        return ready is None or bool(ready.query())

    def wait_ready(self) -> None:
        """Until the values are on the host; safe from another thread than the one reading them."""
        ready = self._ready
        if ready is not None:
            ready.synchronize()

    def wait(self) -> torch.Tensor:
        """The values, valid until the next copy of their `DeviceToHost` starts."""
        if self._ready is not None:
            self._ready.synchronize()
            self._ready = None
        if self._release is not None:
            release, self._release = self._release, None
            release()
        return self.host

    def tolist(self) -> list[Any]:
        return self.wait().tolist()


class DeviceToHost:
    """Copies device tensors to the host on a side stream, each behind an event, into pinned buffers
    that are used again only once the host has read them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream = side_stream(device)
        self._free: list[torch.Tensor] = []  # pinned buffers whose values the host has read

    def start(self, values: torch.Tensor) -> HostValues:
        """Queue the copy of 1-D int64 `values` (after the work that computes them) and return at
        once; on the CPU the values themselves."""
        if self._stream is None:
            return HostValues(values, None)
        n = values.shape[0]
        buffer = self._free.pop() if self._free else pinned_empty((0,), torch.long, self.device)
        if buffer.shape[0] < n:
            buffer = pinned_empty((max(256, 2 * n),), torch.long, self.device)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            buffer[:n].copy_(values, non_blocking=True)
            values.record_stream(self._stream)  # allocated on the main stream, read on this one
            ready = new_event(self.device)
            ready.record()
        return HostValues(buffer[:n], ready, lambda: self._free.append(buffer))
