"""A client that hangs up mid-stream takes its request out of the batch at once: the default.

Real batcher, worker and gateway processes with the default settings (a 30 s resume window, which
only requests that ask for `"resumable": true` get); the request here does not ask. The
batcher's inbox orders the gateway's abort among the workers' step results, so the test counts the
steps that still computed the request after the abort reached the batcher: only those already sent
(one per worker, two with async scheduling). The abort after a resume window (a resumable request),
and a request that runs on while nobody follows it, are `tests/stack/streams/test_resume.py`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from common import streams
from harness.load.disconnect_probe import aborted, inbox_tail_id, settle, trace
from harness.load.load_clients import completion_body, stream
from harness.processes.services import Stack, running_stack, wait_for

MAX_TOKENS = 400
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def stack(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path: Path
) -> Iterator[tuple[Stack, int]]:
    """The stack, and how many steps per worker can be in flight (already sent) at any moment."""
    async_scheduling: bool = request.param
    env = {"BATCHER_ASYNC_SCHEDULING": str(async_scheduling).lower()}
    # The default resume window: only resumable requests get it.
    with running_stack(tmp_path, tiny_model_dir, batcher_env=env) as stack:
        yield stack, 2 if async_scheduling else 1


async def _hang_up_after(base_url: str, num_tokens: int) -> tuple[str, float]:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        out = await stream(client, completion_body(PROMPT, MAX_TOKENS, stream=True), hang_up_after=num_tokens)
    assert out.left_at is not None and not out.errors, out
    return out.req_id, out.left_at


def test_disconnected_request_leaves_the_batch_within_one_step(stack: tuple[Stack, int]) -> None:
    services, in_flight = stack
    r = redis.Redis.from_url(services.redis_url)
    for num_tokens in (2, 9, 30):
        since = inbox_tail_id(r)
        req_id, left_at = asyncio.run(_hang_up_after(services.base_url, num_tokens))
        # The batcher ends an aborted request's token stream with request_aborted.
        wait_for(lambda: aborted(r, req_id), 30, "the batcher to abort the request")  # noqa: B023
        settle(r)
        departure = trace(r, req_id, left_at, since)
        assert departure.abort_after_ms is not None
        assert departure.steps_after_abort <= in_flight, departure
        assert r.xlen(streams.token_stream(req_id)) < MAX_TOKENS
    wait_for(lambda: services.stats()["num_running"] == 0, 30, "the batch to empty")
    assert services.stats()["num_aborted"] == 3
