"""The `cbserve.run_batch` task: one slice of a batch's run (cbserve_celery/batch_run.py) per task.

The gateway queues it by name when a batch is created. A task runs the batch for at most
`batch_slice_s`, then queues its continuation; one that finds another task holding the batch tries
again after the claim TTL, so a batch is never left without a task while it is active. Redis going
away mid-run ends the run with every finished line kept; the task runs the batch again, and queues
what follows, once Redis answers (cbserve_celery/redis_waits.py): never through `self.retry()`, whose
publish needs the broker that just went away. A task that gives up on Redis leaves its batch to the
reaper (cbserve_celery/batch_reaper.py).
"""

from __future__ import annotations

import asyncio

from celery import Celery, Task

from cbserve_celery.batch_claim import new_claim_token
from cbserve_celery.batch_run import Outcome, RunConfig, run_batch
from cbserve_celery.model_tokenizers import ModelTokenizers
from cbserve_celery.redis_waits import retry_while_redis_fails
from cbserve_celery.settings import CelerySettings
from common.redis_io.redis_conn import connect_async
from openai_frontend.batch.objects import RUN_BATCH_TASK


def add_batch_task(app: Celery, settings: CelerySettings, tokenizers: ModelTokenizers) -> None:
    config = RunConfig(
        max_lines_in_flight=settings.batch_max_lines_in_flight,
        slice_s=settings.batch_slice_s,
        claim_ttl_s=settings.batch_lease_ttl_s,
        cell=settings.cell,
    )

    def run(batch_id: str, claim_token: str) -> Outcome:
        redis = connect_async(settings.redis_url, settings.redis_cluster)
        return asyncio.run(run_batch(redis, batch_id, tokenizers, config, claim_token))

    @app.task(name=RUN_BATCH_TASK, bind=True, shared=False)
    def run_batch_task(self: Task, batch_id: str) -> str:
        claim_token = new_claim_token()  # every run of this task's shares it: see batch_claim.py
        within_s = settings.batch_redis_wait_s
        outcome = retry_while_redis_fails(lambda: run(batch_id, claim_token), within_s, f"batch {batch_id}")
        if outcome is not Outcome.DONE:
            # This task's message is acknowledged only once it returns: what follows is queued first.
            countdown = config.claim_ttl_s if outcome is Outcome.BUSY else None
            retry_while_redis_fails(
                lambda: self.apply_async((batch_id,), countdown=countdown),
                within_s,
                f"batch {batch_id}: queueing its next task",
            )
        return outcome.value
