"""The worker as a real process against a real redis-server: announce, heartbeat, step, tokens, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from common.protocol import (
    FIELD,
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SamplingParams,
    TokenEvent,
    WorkerInfo,
    decode_event,
    decode_inbox,
    decode_worker,
    encode,
)
from common.streams import BATCHER_INBOX, WORKERS_HASH, WORKERS_HEARTBEAT, token_stream, worker_steps
from harness.gpu_worker.worker_steps import new_request, scheduler_output

REPO_ROOT = Path(__file__).resolve().parents[3]
T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None], timeout: float, what: str, proc: subprocess.Popen[bytes]
) -> T:
    """Poll `condition` until it returns something truthy; fail early if the worker died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        assert proc.poll() is None, f"worker exited with {proc.returncode} while waiting for {what}"
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def start_worker(
    model_dir: Path, redis_url: str, tmp_path: Path, **extra: str
) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "PYTHONPATH": str(REPO_ROOT),
        "WORKER_NUM_THREADS": "1",
        "WORKER_NUM_BLOCKS": "32",
        "WORKER_HEARTBEAT_INTERVAL_S": "0.1",
        "WORKER_HEALTH_FILE": str(tmp_path / "alive"),
        **extra,
    }
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_worker", "--model", str(model_dir), "--device", "cpu"],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()
        sys.stdout.write((tmp_path / "worker.log").read_text())  # shown by pytest only on failure


@pytest.fixture()
def worker_proc(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    yield from start_worker(tiny_model_dir, redis_url, tmp_path)


@pytest.fixture()
def device_worker_proc(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A null-model worker whose steps take 300 ms on a simulated device, the host free meanwhile."""
    yield from start_worker(
        tiny_model_dir, redis_url, tmp_path, WORKER_NULL_MODEL="true", WORKER_NULL_MODEL_STEP_MS="300"
    )


def read_inbox(client: redis.Redis, last_id: str) -> tuple[str, Any] | None:
    reply: Any = client.xread({BATCHER_INBOX: last_id}, count=1, block=100)
    if not reply:
        return None
    entry_id, fields = reply[0][1][0]
    return entry_id.decode(), decode_inbox(fields[FIELD])


def step_message(
    step_id: int, new: list[NewRequestData], cached: list[CachedRequestData], num: dict[str, int]
) -> bytes:
    return encode(scheduler_output(step_id, new, cached, num))


def test_worker_serves_a_step_and_deregisters(
    worker_proc: subprocess.Popen[bytes], redis_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)

    def workers() -> Any:
        return client.hgetall(WORKERS_HASH)

    raw = wait_for(workers, 60, "the worker's WorkerInfo", worker_proc)
    (worker_key, value), *_ = raw.items()
    info = decode_worker(value)
    assert info.worker_id == worker_key.decode()
    assert (info.num_blocks, info.block_size, info.max_model_len) == (32, 16, 512)

    first_beat = wait_for(
        lambda: client.zscore(WORKERS_HEARTBEAT, info.worker_id), 10, "a heartbeat", worker_proc
    )
    wait_for(
        lambda: (client.zscore(WORKERS_HEARTBEAT, info.worker_id) or 0) > first_beat,
        10,
        "a later heartbeat",
        worker_proc,
    )
    # The container healthcheck's signal: touched after beats that reached Redis.
    wait_for(lambda: (tmp_path / "alive").exists(), 10, "the health file", worker_proc)
    hello_id, hello = wait_for(lambda: read_inbox(client, "0-0"), 10, "the hello on the inbox", worker_proc)
    assert isinstance(hello, WorkerInfo) and hello.worker_id == info.worker_id

    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    new = new_request("req-1", prompt, params, [info.num_blocks - 1], attempt=3)
    steps = worker_steps(info.worker_id)
    client.xadd(steps, {FIELD: step_message(1, [new], [], {"req-1": len(prompt)})})
    result_id, result = wait_for(lambda: read_inbox(client, hello_id), 30, "step 1's result", worker_proc)
    assert isinstance(result, ModelRunnerOutput)
    assert (result.step_id, result.worker_id, result.req_ids) == (1, info.worker_id, ["req-1"])
    assert result.finish_reasons == [None] and result.num_scheduled_tokens == len(prompt)

    cached = CachedRequestData(req_id="req-1", new_block_ids=[], num_computed_tokens=len(prompt))
    client.xadd(steps, {FIELD: step_message(2, [], [cached], {"req-1": 1})})
    _, second = wait_for(lambda: read_inbox(client, result_id), 30, "step 2's result", worker_proc)
    assert isinstance(second, ModelRunnerOutput) and second.finish_reasons == ["length"]

    entries: Any = client.xrange(token_stream("req-1"))
    events = [decode_event(fields[FIELD]) for _, fields in entries]
    expected = [
        TokenEvent(req_id="req-1", index=0, token_id=result.sampled_token_ids[0], attempt=3),
        TokenEvent(
            req_id="req-1", index=1, token_id=second.sampled_token_ids[0], attempt=3, finish_reason="length"
        ),
    ]
    assert events == expected
    assert client.ttl(token_stream("req-1")) > 0  # finished streams expire after the resume window

    worker_proc.send_signal(signal.SIGTERM)
    assert worker_proc.wait(timeout=15) == 0
    assert client.hget(WORKERS_HASH, info.worker_id) is None
    assert client.zscore(WORKERS_HEARTBEAT, info.worker_id) is None
    assert not client.exists(steps)


def test_a_step_sent_while_the_last_one_runs_is_launched_before_that_one_is_published(
    device_worker_proc: subprocess.Popen[bytes], redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    hello_id, hello = wait_for(lambda: read_inbox(client, "0-0"), 60, "the hello", device_worker_proc)
    assert isinstance(hello, WorkerInfo)
    prompt = [5, 6, 7, 8]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    new = new_request("req-1", prompt, params, [0], attempt=1)
    steps = worker_steps(hello.worker_id)

    def decode(step_id: int, computed: int) -> bytes:
        cached = CachedRequestData(req_id="req-1", new_block_ids=[], num_computed_tokens=computed)
        return step_message(step_id, [], [cached], {"req-1": 1})

    # As async scheduling sends them: step 2 decodes the token step 1 samples, before its result.
    pipe = client.pipeline(transaction=True)
    pipe.xadd(steps, {FIELD: step_message(1, [new], [], {"req-1": len(prompt)})})
    pipe.xadd(steps, {FIELD: decode(2, len(prompt))})
    pipe.execute()
    proc = device_worker_proc
    first_id, first = wait_for(lambda: read_inbox(client, hello_id), 30, "step 1's result", proc)
    second_id, second = wait_for(lambda: read_inbox(client, first_id), 30, "step 2's result", proc)
    assert isinstance(first, ModelRunnerOutput) and isinstance(second, ModelRunnerOutput)
    assert (first.step_id, first.overlapped) == (1, False)
    # Received and launched while step 1 ran: its input was step 1's token, taken on the device.
    assert (second.step_id, second.overlapped, second.req_ids) == (2, True, ["req-1"])
    # Sent once step 2's result is in: nothing runs, so nothing overlaps.
    client.xadd(steps, {FIELD: decode(3, len(prompt) + 1)})
    _, third = wait_for(lambda: read_inbox(client, second_id), 30, "step 3's result", proc)
    assert isinstance(third, ModelRunnerOutput)
    assert (third.step_id, third.overlapped, third.finish_reasons) == (3, False, ["length"])
    entries: Any = client.xrange(token_stream("req-1"))
    events = [decode_event(fields[FIELD]) for _, fields in entries]
    assert [(e.index, e.token_id) for e in events if isinstance(e, TokenEvent)] == [(0, 0), (1, 0), (2, 0)]
