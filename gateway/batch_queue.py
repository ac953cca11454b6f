"""Hands a batch to the Celery workers: `send_task` by name, so the gateway needs the celery package
only, never the task's code. Without celery installed, creating a batch answers 503 and says why."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from openai_frontend.batch.objects import RUN_BATCH_TASK


class BatchQueueUnavailable(Exception):
    """Batches cannot be handed to a worker; the message says what to install or start."""


class BatchQueue:
    def __init__(self, redis_url: str) -> None:
        self._redis_url = redis_url
        self._lock = threading.Lock()
        self._app: Any = None  # the Celery app, made on first use

    def _celery(self) -> Any:
        with self._lock:
            if self._app is None:
                try:
                    from celery import Celery
                except ImportError as exc:
                    raise BatchQueueUnavailable(
                        "the Batch API needs the celery package next to the gateway "
                        "(pip install 'cbserve[celery]') and a running cbserve Celery worker"
                    ) from exc
                app = Celery("cbserve-gateway", broker=self._redis_url, set_as_current=False)
                app.conf.update(task_serializer="json", accept_content=["json"])
                self._app = app
            return self._app

    async def enqueue(self, batch_id: str) -> None:
        """Queue the task that runs `batch_id`; raises BatchQueueUnavailable when it cannot be sent."""
        app = self._celery()
        try:
            # kombu publishes synchronously (and retries a few times while Redis is away): off the loop.
            await asyncio.to_thread(app.send_task, RUN_BATCH_TASK, args=[batch_id])
        except Exception as exc:
            raise BatchQueueUnavailable(f"the batch could not be queued for a Celery worker: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._app is not None:
                self._app.close()
                self._app = None
