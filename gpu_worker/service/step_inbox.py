"""What the worker loop waits for, in one queue: its next step, read from Redis on a thread of its
own, or the end of the step it runs on the device, watched on another. The loop takes whichever
comes first, so a step sent while the device runs is launched at once, and a step whose device
work ends with no step behind it is published at once (a Redis read cannot time out that precisely).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpu_worker.runner.step.launched import StepHandle

logger = logging.getLogger(__name__)

# A read of the steps stream: (stream, after this entry id) -> the entries that came, each (id,
# message), after blocking at most about a second; None when the worker stops.
ReadSteps = Callable[[str, str], Sequence[tuple[str, bytes | None]] | None]


@dataclass(frozen=True, slots=True)
class StepMessage:
    stream: str  # the steps stream it came from (the worker's id may have changed since)
    entry_id: str
    message: bytes | None  # None: an entry without the message field


@dataclass(frozen=True, slots=True)
class DeviceDone:
    handle: StepHandle  # its samples are on the host: reading them waits for nothing


class StepInbox:
    def __init__(self, read: ReadSteps, stream: str, after_id: str) -> None:
        self._read = read
        self._stream, self._after_id = stream, after_id
        self._items: queue.Queue[StepMessage | DeviceDone | None] = queue.Queue()
        self._watched: queue.Queue[StepHandle | None] = queue.Queue()
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # the stream and position the reader reads next
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._failing_loudly(self._read_steps), name="steps", daemon=True),
            threading.Thread(target=self._failing_loudly(self._watch_device), name="device", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def get(self, timeout: float) -> StepMessage | DeviceDone | None:
        """The next step or device end, or None after `timeout` seconds with neither; raises what
        stopped a thread of the inbox (the worker loop stops on it, as it would on its own)."""
        try:
            item = self._items.get(timeout=timeout)
        except queue.Empty:
            item = None
        if self._error is not None:
            raise RuntimeError("the worker's step inbox failed") from self._error
        return item

    def watch(self, handle: StepHandle) -> None:
        """Deliver a `DeviceDone` once `handle`'s step has left the device."""
        self._watched.put(handle)

    def follow(self, stream: str, after_id: str) -> None:
        """Read `stream` from `after_id` on (a worker that rejoined under a new id); messages of
        the old stream may still arrive: the caller drops them by `StepMessage.stream`."""
        with self._lock:
            self._stream, self._after_id = stream, after_id

    def stop(self) -> None:
        self._stopping.set()
        self._watched.put(None)
        for thread in self._threads:
            thread.join(timeout=10.0)

    def _failing_loudly(self, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                loop()
            except BaseException as exc:  # surfaces in `get`, which the worker loop calls every second
                logger.exception("the step inbox's %s thread failed", threading.current_thread().name)
                self._error = exc
                self._items.put(None)  # wakes `get` at once

        return run

    def _read_steps(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                stream, after_id = self._stream, self._after_id
            entries = self._read(stream, after_id)
            if not entries:
                continue
            with self._lock:
                if self._stream == stream:
                    self._after_id = entries[-1][0]
            for entry_id, message in entries:
                self._items.put(StepMessage(stream, entry_id, message))

    def _watch_device(self) -> None:
        while (handle := self._watched.get()) is not None:
            handle.wait_ready()
            self._items.put(DeviceDone(handle))
