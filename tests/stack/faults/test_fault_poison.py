"""Poison input: a request that makes the worker fail fails alone; its batch goes on.

Requests are written straight to the requests stream (the raw protocol, no gateway validation):
four ordinary greedy ones, one whose token id is outside the vocabulary (the worker's step check
rejects it), one holding the token the worker is told to raise on (WORKER_FAIL_ON_TOKEN_ID: an
exception inside the forward pass, isolated by rerunning the step request by request), and one entry
that is not a request at all. The ordinary ones must come out exactly as `generate`'s; each poison
request is retried on fresh attempts, then, on its BATCHER_MAX_DELIVERIES-th failure, ends with a
RequestError on its token stream and lands in the dead-letter stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from benchmarks.gpu.gpu_parity import reference_greedy
from common import streams
from common.protocol import (
    FIELD,
    GenerateRequest,
    RequestError,
    SamplingParams,
    StreamEvent,
    TokenEvent,
    decode_event,
    decode_request,
    encode,
)
from harness.processes.services import Stack, wait_for

MAX_TOKENS = 24
PROMPTS = [[11, 12, 13], [40, 41, 42, 43, 44, 45, 46], [300, 200, 100], [7, 8, 9, 10, 250]]
OUT_OF_VOCAB = 10**6


def _events(client: Any, req_id: str) -> list[StreamEvent]:
    return [decode_event(fields[FIELD]) for _, fields in client.xrange(streams.token_stream(req_id))]


def _ended(events: list[StreamEvent]) -> bool:
    return bool(events) and (
        isinstance(events[-1], RequestError)
        or (isinstance(events[-1], TokenEvent) and events[-1].finish_reason)
    )


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_poison_requests_fail_alone_and_are_dead_lettered(
    scheduling: str, make_stack: Callable[[], Stack], tiny_model_dir: Path
) -> None:
    expected = reference_greedy(tiny_model_dir, PROMPTS, MAX_TOKENS)
    used = {t for seq in [*PROMPTS, *expected] for t in seq}
    poison_token = next(t for t in range(3, 512) if t not in used)  # never produced by the others

    stack = make_stack()
    # BATCHER_MAX_DELIVERIES defaults to 3. With async scheduling the step after a failure already
    # holds the failed request (the worker no longer knows it): that must not count twice.
    stack.start_batcher(BATCHER_ASYNC_SCHEDULING=str(scheduling == "async").lower())
    stack.start_worker("worker0", WORKER_FAIL_ON_TOKEN_ID=str(poison_token))
    client: Any = redis.Redis.from_url(stack.redis_url)
    wait_for(lambda: stack.num_workers_joined() == 1, 90, "the worker to join")

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    prompts = {f"ok-{i}": p for i, p in enumerate(PROMPTS)}
    prompts["raises"] = [20, poison_token, 21]
    prompts["out-of-vocab"] = [20, OUT_OF_VOCAB, 21]
    pipe = client.pipeline()
    for req_id, prompt in prompts.items():  # one round trip: they share the first step
        msg = GenerateRequest(
            req_id=req_id, prompt_token_ids=prompt, sampling_params=params, arrival_time=time.time()
        )
        pipe.xadd(streams.REQUESTS_STREAM, {FIELD: encode(msg)})
    pipe.xadd(streams.REQUESTS_STREAM, {FIELD: b"not msgpack"})
    submitted = time.monotonic()
    pipe.execute()

    wait_for(lambda: all(_ended(_events(client, r)) for r in prompts), 60, "every request to end")
    failed_after = time.monotonic() - submitted

    for i, want in enumerate(expected):
        events = _events(client, f"ok-{i}")
        assert all(isinstance(e, TokenEvent) for e in events), events
        assert [e.index for e in events] == list(range(MAX_TOKENS))  # type: ignore[union-attr]
        assert [e.token_id for e in events] == want  # type: ignore[union-attr]
    for req_id, why in (("raises", "fail_on_token_id"), ("out-of-vocab", "outside the vocabulary")):
        events = _events(client, req_id)
        assert len(events) == 1 and isinstance(events[0], RequestError), events
        assert why in events[0].message and "3 deliveries" in events[0].message, events[0].message

    dead: Any = client.xrange(streams.DEAD_LETTER_STREAM)
    letters = [fields for _, fields in dead]
    unreadable = [f for f in letters if f[b"error"].startswith(b"unreadable request")]
    assert len(letters) == 3 and len(unreadable) == 1 and unreadable[0][FIELD] == b"not msgpack", letters
    # The rest keep the original request, ready to be inspected or replayed.
    given_up = {
        (msg := decode_request(f[FIELD])).req_id: (msg.prompt_token_ids, int(f[b"deliveries"]))
        for f in letters
        if f not in unreadable
    }
    assert given_up == {"raises": (prompts["raises"], 3), "out-of-vocab": (prompts["out-of-vocab"], 3)}

    stats = stack.stats_after(4)
    assert (stats["num_finished"], stats["num_failed"], stats["num_dead_lettered"]) == (4, 2, 2), stats
    assert stats["num_retries"] == 4, stats
    # Nothing is left pending: every request, poison or not, was acknowledged.
    assert client.xpending(streams.REQUESTS_STREAM, streams.BATCHER_GROUP)["pending"] == 0
    assert "rerunning it request by request" in stack.log("worker0")
    print(f"\npoison requests ({scheduling}) failed after 3 deliveries, {failed_after:.2f}s after submission")
