"""Queue-based clients against the real stack: what they get equals what HTTP gives (greedy).

One stack serves the whole module: the stream client (sync and async), the README's and
docs/protocol.md's examples run verbatim, and a real Celery worker on the test's Redis as broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from celery import Celery

from cbserve_celery.app import GENERATE_TASK
from common.protocol import FIELD, GenerateRequest, SamplingParams, decode_request
from common.stream_client import follow, follow_async, new_req_id, submit, submit_async
from common.streams import REQUESTS_STREAM, submitted_key
from harness.processes.celery_thread import celery_in_thread
from harness.processes.services import ROOT, Stack, running_stack
from harness.user.readme_examples import example
from harness.user.readme_examples import run_example as run_readme_example

PROMPTS = [[1, 17, 42, 99], [5, 6, 7, 8, 9, 10, 11, 200, 300, 400], [3]]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("queue-clients"), tiny_model_dir) as stack:
        yield stack


def http_completion(stack: Stack, prompt: list[int] | str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {
        "model": stack.model_dir.name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        **extra,
    }
    resp = httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return dict(resp.json()["choices"][0])


def _request(prompt: list[int], **params: Any) -> GenerateRequest:
    return GenerateRequest(
        req_id=new_req_id(),
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, **params),
        arrival_time=time.time(),
    )


def test_stream_client_gets_the_tokens_http_gets(stack: Stack) -> None:
    r = redis.Redis.from_url(stack.redis_url)
    for prompt in PROMPTS:
        expected = http_completion(stack, prompt, MAX_TOKENS, ignore_eos=True)
        request = _request(prompt, ignore_eos=True)
        submit(r, request)
        events = list(follow(r, request.req_id, timeout_s=60))
        assert [e.token_id for e in events] == expected["token_ids"]
        assert [e.index for e in events] == list(range(MAX_TOKENS))
        assert events[-1].finish_reason == expected["finish_reason"] == "length"


def test_async_stream_client_gets_the_tokens_http_gets(stack: Stack) -> None:
    expected = [http_completion(stack, p, MAX_TOKENS, ignore_eos=True)["token_ids"] for p in PROMPTS]

    async def run_all() -> list[list[int]]:
        r = aioredis.Redis.from_url(stack.redis_url)

        async def one(prompt: list[int]) -> list[int]:
            request = _request(prompt, ignore_eos=True)
            await submit_async(r, request)
            return [e.token_id async for e in follow_async(r, request.req_id, timeout_s=60)]

        try:
            return await asyncio.gather(*(one(p) for p in PROMPTS))
        finally:
            await r.aclose()

    assert asyncio.run(run_all()) == expected


def run_example(code: str, redis_url: str) -> str:
    return run_readme_example(code, {"REDIS_URL": redis_url})


def test_protocol_doc_example_runs_verbatim(stack: Stack) -> None:
    out = run_example(example(ROOT / "docs" / "protocol.md", "raw-protocol"), stack.redis_url)
    expected = http_completion(stack, [1, 17, 42, 99], 8, ignore_eos=True)
    assert out.strip() == f"{expected['token_ids']} length"


def test_readme_stream_client_example_runs_verbatim(stack: Stack) -> None:
    out = run_example(example(ROOT / "README.md", "stream-client"), stack.redis_url)
    expected = http_completion(stack, [1, 17, 42, 99], 8)
    assert out.strip() == str(expected["token_ids"])


@pytest.fixture(scope="module")
def celery_app(stack: Stack) -> Iterator[Celery]:
    """A real Celery worker (in a thread of this process) consuming from the stack's Redis."""
    with celery_in_thread(stack.redis_url, stack.model_dir) as app:
        yield app


def test_celery_task_returns_the_tokens_http_gets(stack: Stack, celery_app: Celery) -> None:
    generate = celery_app.tasks[GENERATE_TASK]
    params = {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    results = [generate.delay(prompt, params) for prompt in PROMPTS]
    for prompt, result in zip(PROMPTS, results, strict=True):
        out = result.get(timeout=60)
        expected = http_completion(stack, prompt, MAX_TOKENS, ignore_eos=True)
        assert out["token_ids"] == expected["token_ids"]
        assert out["text"] == expected["text"]
        assert out["finish_reason"] == "length"
        assert out["req_id"] == f"celery-{result.id}"
        json.dumps(out)  # the result is plain JSON


def test_celery_task_takes_text_prompts(stack: Stack, celery_app: Celery) -> None:
    generate = celery_app.tasks[GENERATE_TASK]
    out = generate.delay("hello world", {"max_tokens": 6, "temperature": 0}).get(timeout=60)
    expected = http_completion(stack, "hello world", 6)
    assert (out["token_ids"], out["text"]) == (expected["token_ids"], expected["text"])


def test_celery_task_run_twice_generates_once(stack: Stack, celery_app: Celery) -> None:
    generate = celery_app.tasks[GENERATE_TASK]
    params = {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    # The same task id delivered twice, as after a worker crash: the second run reads the same request.
    first = generate.apply_async(([1, 2, 3, 4], params), task_id="redelivered").get(timeout=60)
    second = generate.apply_async(([1, 2, 3, 4], params), task_id="redelivered").get(timeout=60)
    assert first == second
    r = redis.Redis.from_url(stack.redis_url)
    submitted = [decode_request(f[FIELD]).req_id for _, f in r.xrange(REQUESTS_STREAM)]
    assert submitted.count("celery-redelivered") == 1


def test_celery_task_reports_failed_requests(celery_app: Celery) -> None:
    generate = celery_app.tasks[GENERATE_TASK]
    with pytest.raises(Exception, match=r"outside the vocabulary"):
        generate.delay([10**6], {"max_tokens": 2}).get(timeout=60)


def test_readme_celery_example_runs_verbatim(stack: Stack, celery_app: Celery) -> None:
    out = run_example(example(ROOT / "README.md", "celery"), stack.redis_url)
    expected = http_completion(stack, [1, 17, 42, 99], 8)
    assert out.strip() == str(expected["token_ids"])


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children


def test_celery_task_survives_its_worker_process_dying(
    stack: Stack, celery_app: Celery, tmp_path: Path
) -> None:
    """A `celery worker` (prefork, one child) whose child is SIGKILLed mid-task: the task is requeued
    (task_reject_on_worker_lost), runs again in a new child, and follows the request it had submitted."""
    env = {**os.environ, "REDIS_URL": stack.redis_url, "CBSERVE_CELERY_REQUEST_TIMEOUT_S": "60"}
    log = tmp_path / "celery.log"
    args = ["-A", "cbserve_celery.worker", "worker", "--pool", "prefork", "--concurrency", "1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", *args, "-Q", "crash", "--loglevel", "INFO"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        r = redis.Redis.from_url(stack.redis_url)
        params = {"max_tokens": 400, "temperature": 0, "ignore_eos": True}
        result = celery_app.tasks[GENERATE_TASK].apply_async(([9, 8, 7, 6], params), queue="crash")
        deadline = time.monotonic() + 60
        while not r.exists(submitted_key(f"celery-{result.id}")):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        [child] = _children(proc.pid)
        os.kill(child, 9)
        out = result.get(timeout=120)
        text = log.read_text()
        assert "signal 9" in text and text.count(f"{result.id}] received") == 2, text
        expected = http_completion(stack, [9, 8, 7, 6], 400, ignore_eos=True)
        assert out["token_ids"] == expected["token_ids"]
        submitted = [decode_request(f[FIELD]).req_id for _, f in r.xrange(REQUESTS_STREAM)]
        assert submitted.count(f"celery-{result.id}") == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
