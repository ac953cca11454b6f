"""Step results leave on a thread of their own, so the next step starts while the last one's travel.

With async scheduling the next step is already in the worker's stream when a step ends; publishing
first would put a Redis round trip between every two forwards. Results are published strictly in
order (one thread, one queue); a fenced publish, or any error, reaches the worker loop through
`fenced` and `raise_if_failed`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpu_worker.service.fenced_writes import TokenWrites

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class PublishJob:
    worker_id: str
    step_id: int
    tokens: TokenWrites
    result: bytes  # the encoded ModelRunnerOutput
    steps_min_id: str  # the steps stream is consumed up to here


class PublishThread:
    def __init__(self, publish: Callable[[PublishJob], bool | None]) -> None:
        """`publish` returns False when the worker is fenced, None when the worker is stopping."""
        self._publish = publish
        # Async scheduling keeps at most two steps in flight: a short queue never blocks for long, and
        # a stalled Redis stops the loop instead of piling up results.
        self._jobs: queue.Queue[PublishJob | None] = queue.Queue(maxsize=2)
        self.fenced = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="publish", daemon=True)
        self._thread.start()

    def submit(self, job: PublishJob) -> None:
        self.raise_if_failed()
        self._jobs.put(job)

    def drain(self) -> None:
        """Wait until everything submitted has been published (or refused)."""
        self._jobs.join()
        self.raise_if_failed()

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10.0)

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError("publishing a step result failed") from self._error

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None and self._publish(job) is False:
                    logger.warning("step %d not published: worker %s was fenced", job.step_id, job.worker_id)
                    self.fenced.set()
            except BaseException as exc:  # surfaces in the worker loop, which stops the worker
                logger.exception("publishing step %d failed", job.step_id if job else -1)
                self._error = exc
            finally:
                self._jobs.task_done()
