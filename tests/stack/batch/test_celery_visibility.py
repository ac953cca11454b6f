"""A Celery worker's tasks at the broker: a running one is never delivered again, however long it
runs; a dead worker's batch moves on to a new worker within about a minute at the defaults, and a
cancel made while no worker holds it ends it too.

The Redis broker hands a task back once it has been unacknowledged for the visibility timeout. Before
the delivery heartbeats (cbserve_celery/visibility.py) that timeout had to outlast every task, so its
default was an hour, and a killed worker's batch sat `in_progress` (or `cancelling`) that long.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import redis

from cbserve_celery.settings import CelerySettings
from harness.load.batch_runs import check_submitted_once, part_done, submit_batch
from harness.processes.services import Stack, wait_for
from tests.stack.batch.test_batch_api import wait_final

FINAL = {"completed", "failed", "expired", "cancelled"}


def _deliveries(log: str) -> list[str]:
    return re.findall(r"Task cbserve\.run_batch\[([0-9a-f-]+)\] received", log)


def test_a_running_task_is_not_delivered_again(redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """A 4 s visibility timeout and one slice of 60 s: the batch runs in one task for longer than the
    timeout, and the broker never hands that task to anyone again."""
    stack = Stack(redis_url=redis_url, model_dir=tiny_model_dir, log_dir=tmp_path)
    env = {
        "CBSERVE_CELERY_VISIBILITY_TIMEOUT_S": "4",
        "CBSERVE_CELERY_REQUEST_TIMEOUT_S": "3",
        "CBSERVE_CELERY_BATCH_SLICE_S": "60",
        "CBSERVE_CELERY_BATCH_LEASE_TTL_S": "2",
        "CBSERVE_CELERY_BATCH_MAX_LINES_IN_FLIGHT": "1",
    }
    try:
        # The Celery worker first, so that it is ready with the others.
        stack.start_celery_worker("celery", **env)
        stack.start_all()
        # Long enough to outlast the timeout on a fast host too (24 x 128 took 5.1 s on one).
        client, batch_id, _ = submit_batch(stack.base_url, 48, max_tokens=160)
        started = time.monotonic()
        batch = wait_final(client, batch_id, timeout=120)
        took_s = time.monotonic() - started
        assert batch.status == "completed", batch
        assert took_s > 6, f"the batch took {took_s:.1f}s: too short to outlast the visibility timeout"
        deliveries = _deliveries(stack.log("celery"))
        assert len(deliveries) == len(set(deliveries)), deliveries  # each task delivered once
    finally:
        stack.stop()


@pytest.mark.parametrize("then", ["complete", "cancel"])
def test_a_dead_workers_batch_moves_on_at_the_defaults(
    then: str, redis_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL of the Celery worker mid-batch at the default visibility timeout and batch lease; a new
    worker finishes the batch (or its cancel) within about a minute of the kill."""
    defaults = CelerySettings(redis_url=redis_url)
    stack = Stack(redis_url=redis_url, model_dir=tiny_model_dir, log_dir=tmp_path)
    lines = {"CBSERVE_CELERY_BATCH_MAX_LINES_IN_FLIGHT": "2"}  # only this one off its default
    try:
        # The Celery worker first, so that it is ready with the others.
        first = stack.start_celery_worker("celery1", **lines)
        stack.start_all()
        client, batch_id, req_ids = submit_batch(stack.base_url, 16, max_tokens=48)
        r = redis.Redis.from_url(redis_url)
        wait_for(part_done(r, batch_id, req_ids), 60, "the batch to be part done with lines in flight")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic()
        del stack.procs["celery1"]
        stack.start_celery_worker("celery2", **lines)
        if then == "cancel":
            assert client.batches.cancel(batch_id).status == "cancelling"
        # The timeout after the last heartbeat, the restore sweep, a new worker's start: 2 minutes.
        assert defaults.visibility_timeout_s <= 60
        wait_for(lambda: client.batches.retrieve(batch_id).status in FINAL, 120, "the batch to end")
        moved_on_s = time.monotonic() - killed_at
        batch = wait_final(client, batch_id)
        print(f"\nCelery worker killed at the defaults: batch {batch.status} {moved_on_s:.1f}s later")
        if then == "cancel":
            assert batch.status == "cancelled", batch
        else:
            assert batch.status == "completed", batch
            check_submitted_once(r, batch_id, req_ids)
        stack.check_alive()
    finally:
        stack.stop()
