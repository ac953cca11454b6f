"""The `cbserve.run_batch` task: one slice of a batch's run (cbserve_celery/batch_runner.py) per task.

The gateway queues it by name when a batch is created. A task runs the batch for at most
`batch_slice_s`, then queues its continuation; one that finds another task holding the batch tries
again after the claim TTL, so a batch is never left without a task while it is active. Redis going
away mid-run ends the run with every finished line kept, and the task is retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis.exceptions
from celery import Celery, Task

from cbserve_celery.batch_runner import Outcome, RunConfig, run_batch
from cbserve_celery.settings import CelerySettings
from common.redis_conn import connect_async
from openai_frontend.batch.objects import RUN_BATCH_TASK
from openai_frontend.model.tokenizer import ModelTokenizer


def add_batch_task(
    app: Celery, settings: CelerySettings, tokenizer: Callable[[], ModelTokenizer | None]
) -> None:
    config = RunConfig(
        max_lines_in_flight=settings.batch_max_lines_in_flight,
        slice_s=settings.batch_slice_s,
        claim_ttl_s=settings.batch_lease_ttl_s,
        cell=settings.cell,
    )
    model_root = str(settings.model or "")

    @app.task(name=RUN_BATCH_TASK, bind=True, max_retries=None)
    def run_batch_task(self: Task, batch_id: str) -> str:
        try:
            outcome = asyncio.run(
                run_batch(
                    connect_async(settings.redis_url, settings.redis_cluster),
                    batch_id,
                    tokenizer(),
                    model_root,
                    config,
                )
            )
        except redis.exceptions.RedisError as exc:
            raise self.retry(exc=exc, countdown=config.claim_ttl_s) from exc
        if outcome is Outcome.CONTINUE:
            self.apply_async((batch_id,))
        elif outcome is Outcome.BUSY:
            self.apply_async((batch_id,), countdown=config.claim_ttl_s)
        return outcome.value
