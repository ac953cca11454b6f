"""A real Celery worker of cbserve_celery in a thread of the test process, on a stack's Redis."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from celery import Celery
from celery.contrib.testing.worker import start_worker

from cbserve_celery.app import make_app
from cbserve_celery.settings import CelerySettings


@contextmanager
def celery_in_thread(redis_url: str, model_dir: Path, request_timeout_s: float = 60) -> Iterator[Celery]:
    settings = CelerySettings(redis_url=redis_url, model=model_dir, request_timeout_s=request_timeout_s)
    app = make_app(settings)
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False, shutdown_timeout=30):
        yield app
    # The tests' AsyncResults unsubscribe when collected; collected after the stack's Redis is gone,
    # each retries for 20 s in whatever thread the collector ran in (a later test's gateway loop).
    gc.collect()
    app.close()
