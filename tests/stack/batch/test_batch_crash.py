"""A Celery worker killed (SIGKILL) in the middle of a batch: a new worker finishes it, exactly once.

The worker runs `cbserve.run_batch` in 2-second slices (so continuations are exercised too), with a
6-second visibility timeout: the task the dead worker held comes back to the new one once that has
run out. Every line's request must have been submitted once (its id derives from batch and line), and
every output must equal the interactive endpoint's answer.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import openai
import redis

from common.protocol import FIELD, decode_request
from common.streams import REQUESTS_STREAM, batch_outputs, submitted_key
from harness.load.batch_runs import jsonl, request_line
from harness.processes.services import Stack, wait_for
from tests.stack.batch.test_batch_api import wait_final

CRASHY_WORKER = {
    "CBSERVE_CELERY_VISIBILITY_TIMEOUT_S": "6",
    "CBSERVE_CELERY_REQUEST_TIMEOUT_S": "5",
    "CBSERVE_CELERY_BATCH_SLICE_S": "2",
    "CBSERVE_CELERY_BATCH_LEASE_TTL_S": "2",
    "CBSERVE_CELERY_BATCH_MAX_LINES_IN_FLIGHT": "3",
}
NUM_LINES = 12


def test_killed_celery_worker_mid_batch_loses_nothing_and_generates_nothing_twice(
    redis_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    stack = Stack(redis_url=redis_url, model_dir=tiny_model_dir, log_dir=tmp_path)
    try:
        # The Celery worker first, so that it is ready with the others.
        first = stack.start_celery_worker("celery1", **CRASHY_WORKER)
        stack.start_all()
        bodies = [
            {
                "prompt": [i + 1, 7, 9],
                "max_tokens": 48,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            for i in range(NUM_LINES)
        ]
        lines = [request_line(f"line-{i}", body, "/v1/completions") for i, body in enumerate(bodies)]
        client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="none", timeout=60, max_retries=0)
        upload = client.files.create(file=("lines.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h"
        )

        r = redis.Redis.from_url(redis_url)
        req_ids = [f"{batch.id}-{i}" for i in range(NUM_LINES)]

        def mid_batch() -> bool:
            num_done = r.hlen(batch_outputs(batch.id))
            num_submitted = sum(r.exists(submitted_key(i)) for i in req_ids)
            return 3 <= num_done < NUM_LINES and num_submitted > num_done

        wait_for(mid_batch, 60, "the batch to be part done with lines in flight")
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        done_at_kill = r.hlen(batch_outputs(batch.id))
        stack.start_celery_worker("celery2", **CRASHY_WORKER)

        batch = wait_final(client, batch.id, timeout=90)
        assert batch.status == "completed", (batch, stack.log("celery2"))
        assert batch.request_counts is not None and batch.request_counts.completed == NUM_LINES
        assert done_at_kill < NUM_LINES and "cbserve.run_batch" in stack.log("celery2")
        submitted = [decode_request(f[FIELD]).req_id for _, f in r.xrange(REQUESTS_STREAM)]
        assert sorted(i for i in submitted if i.startswith(batch.id)) == sorted(req_ids)  # each once

        assert batch.output_file_id is not None
        results = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
        assert [line["custom_id"] for line in results] == [f"line-{i}" for i in range(NUM_LINES)]
        for line, body in zip(results, bodies, strict=True):
            expected = httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=60).json()
            got = line["response"]["body"]["choices"][0]
            assert (
                got["token_ids"] == expected["choices"][0]["token_ids"]
                and got["text"] == expected["choices"][0]["text"]
            )
    finally:
        stack.stop()
