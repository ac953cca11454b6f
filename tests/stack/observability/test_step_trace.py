"""The batcher's per-step trace (llm:batcher:trace) on real batcher and worker processes: every step
of a known request with the right kind and token count, the stream's cap, TGI's waiting batch, off."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import Any

import redis

from common import streams
from common.protocol import FIELD, GenerateRequest, SamplingParams, decode_worker
from common.stream_client import follow, new_req_id, submit
from common.trace_schema import StepTrace, decode_trace, short_id
from harness.processes.services import Stack, wait_for

BUDGET = 8  # BATCHER_MAX_NUM_BATCHED_TOKENS: a 20-token prompt takes chunks of 8, 8 and 4


def _start(stack: Stack, **batcher_env: str) -> redis.Redis:
    stack.start_batcher(BATCHER_MAX_NUM_SEQS="4", BATCHER_MAX_NUM_BATCHED_TOKENS=str(BUDGET), **batcher_env)
    stack.start_worker()

    def joined() -> bool:
        stack.check_alive()
        return stack.num_workers_joined() == 1

    wait_for(joined, 90, "the worker to join")
    return redis.Redis.from_url(stack.redis_url)


def _request(prompt_len: int, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        req_id=new_req_id(),
        prompt_token_ids=[5 + i % 50 for i in range(prompt_len)],
        sampling_params=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        arrival_time=time.time(),
    )


def _generate(client: redis.Redis, request: GenerateRequest) -> None:
    submit(client, request)
    events = list(follow(client, request.req_id, timeout_s=60))
    assert len(events) == request.sampling_params.max_tokens


def _trace(client: redis.Redis) -> list[StepTrace]:
    entries: Any = client.xrange(streams.BATCHER_TRACE)
    return [decode_trace(fields[FIELD]) for _, fields in entries]


def _steps_of(traces: list[StepTrace], req_id: str) -> list[tuple[str, int, StepTrace]]:
    sid = short_id(req_id)
    return [(r.kind, r.num_tokens, t) for t in traces for r in t.reqs if r.id == sid]


def test_every_step_of_a_request_is_traced(make_stack: Callable[[], Stack]) -> None:
    client = _start(make_stack(), BATCHER_TRACE_MAXLEN="50")
    [raw_info] = client.hvals(streams.WORKERS_HASH)  # type: ignore[misc]
    info = decode_worker(raw_info)
    request = _request(prompt_len=20, max_tokens=5)
    _generate(client, request)

    steps = _steps_of(_trace(client), request.req_id)
    # Chunked prefill of the prompt under the budget, then one decode per token after the first.
    assert [(kind, n) for kind, n, _ in steps] == [("p", 8), ("p", 8), ("p", 4)] + [("d", 1)] * 4
    traces = [t for _, _, t in steps]
    assert [t.step_id for t in traces] == list(range(traces[0].step_id, traces[0].step_id + 7))
    assert all(a.time <= b.time for a, b in itertools.pairwise(traces))
    # The last prefill chunk samples the first token; every decode samples one.
    assert [t.num_sampled for t in traces] == [0, 0, 1, 1, 1, 1, 1]
    # Blocks held after each step: its computed tokens (8, 16, 20, 21, ...) in blocks of the worker's size.
    computed = [8, 16, 20, 21, 22, 23, 24]
    assert [t.num_blocks_used for t in traces] == [math.ceil(c / info.block_size) for c in computed]
    assert {(t.worker_id, t.num_blocks, t.num_waiting, len(t.reqs)) for t in traces} == {
        (info.worker_id, info.num_blocks, 0, 1)
    }
    # The req_id itself is nowhere in the trace: reading it must not let anyone read the request.
    raw: Any = client.xrange(streams.BATCHER_TRACE)
    assert all(request.req_id.encode() not in fields[FIELD] for _, fields in raw)

    # The stream stays capped (MAXLEN ~: Redis trims whole nodes of 100 entries).
    _generate(client, _request(prompt_len=4, max_tokens=300))
    assert client.xlen(streams.BATCHER_TRACE) <= 50 + 100


def test_tgi_prefill_steps_show_the_running_batch_waiting(make_stack: Callable[[], Stack]) -> None:
    client = _start(make_stack(), BATCHER_SCHEDULING_POLICY="tgi")
    first, second = _request(prompt_len=6, max_tokens=60), _request(prompt_len=6, max_tokens=3)
    submit(client, first)
    events = follow(client, first.req_id, timeout_s=60)
    next(events)  # decoding now: the second request arrives mid-batch
    submit(client, second)
    assert len(list(events)) == 59
    assert len(list(follow(client, second.req_id, timeout_s=60))) == 3

    traces = _trace(client)
    [admit] = [t for t in traces if any(r.id == short_id(second.req_id) and r.kind == "p" for r in t.reqs)]
    # TGI prefills the newcomer whole, in a step of its own: the running request waits in the batch.
    assert [(r.id, r.kind, r.num_tokens) for r in admit.reqs] == [
        (short_id(first.req_id), "w", 0),
        (short_id(second.req_id), "p", 6),
    ]
    assert admit.num_sampled == 1


def test_the_trace_can_be_turned_off(make_stack: Callable[[], Stack]) -> None:
    client = _start(make_stack(), BATCHER_TRACE_MAXLEN="0")
    _generate(client, _request(prompt_len=4, max_tokens=3))
    assert not client.exists(streams.BATCHER_TRACE)
