"""How long a request stays in the batch after its client hung up, read back from the batcher's inbox.

Every step result a worker appends to `llm:batcher:inbox` names the requests that step computed, and
the gateway's `AbortRequest` lands in the same stream, so their order there is exact: a step result
after the abort entry is a step that was already sent (or running) when the batcher read the abort.
Entry ids carry Redis's clock in ms, comparable with the client's `time.time()` on one machine.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import redis

from common import streams
from common.protocol import (
    FIELD,
    AbortRequest,
    GenerateRequest,
    ModelRunnerOutput,
    RequestError,
    SamplingParams,
    decode_event,
    decode_inbox,
)
from common.redis_io.redis_conn import entry_key
from common.stream_client import follow, new_req_id, submit


@dataclass(frozen=True, slots=True)
class Departure:
    req_id: str
    steps_after_leaving: int  # steps that computed the request from the client's hang-up on
    steps_after_abort: int  # ...from the moment its abort reached the batcher's inbox
    abort_after_ms: int | None  # hang-up -> abort in the inbox (the gateway's reaction); None: no abort
    last_step_after_ms: int | None  # hang-up -> the request's last step result
    step_ms: float | None  # median time between the request's steps: what one iteration took


def aborted(r: redis.Redis, req_id: str) -> bool:
    """The batcher ended the request's token stream with an error (request_aborted)."""
    # Not necessarily the last entry: the step in flight at the abort may append a token after it.
    rows: Any = r.xrange(streams.token_stream(req_id))
    return any(isinstance(decode_event(fields[FIELD]), RequestError) for _, fields in rows)


def settle(r: redis.Redis, timeout_s: float = 60.0) -> None:
    """Run a one-token request to its end: it is scheduled after everything the batcher has read, so
    every step sent before (an aborted request's last one included) has reported by then."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    probe = GenerateRequest(
        req_id=new_req_id(), prompt_token_ids=[3, 4], sampling_params=params, arrival_time=time.time()
    )
    submit(r, probe)
    for _ in follow(r, probe.req_id, timeout_s=timeout_s):
        pass


def trace(r: redis.Redis, req_id: str, left_at: float, since_id: str) -> Departure:
    """The request's steps in the inbox from `since_id` on, relative to its client's hang-up."""
    left_ms = int(left_at * 1000)
    steps: list[tuple[int, int]] = []
    abort: tuple[int, int] | None = None
    rows: Any = r.xrange(streams.BATCHER_INBOX, since_id, "+")
    for raw_id, fields in rows:
        msg = decode_inbox(fields[FIELD])
        if isinstance(msg, ModelRunnerOutput) and req_id in msg.req_ids:
            steps.append(entry_key(raw_id.decode()))
        elif isinstance(msg, AbortRequest) and msg.req_id == req_id and abort is None:
            abort = entry_key(raw_id.decode())
    return Departure(
        req_id=req_id,
        steps_after_leaving=sum(1 for s in steps if s[0] >= left_ms),
        steps_after_abort=sum(1 for s in steps if abort is not None and s > abort),
        abort_after_ms=None if abort is None else abort[0] - left_ms,
        last_step_after_ms=steps[-1][0] - left_ms if steps else None,
        step_ms=statistics.median(b[0] - a[0] for a, b in pairwise(steps)) if len(steps) > 1 else None,
    )


def inbox_tail_id(r: redis.Redis) -> str:
    """The inbox's newest entry id now: a `since_id` that leaves out everything earlier."""
    info: Any = r.xinfo_stream(streams.BATCHER_INBOX)
    last = info["last-generated-id"]
    return last.decode() if isinstance(last, bytes) else str(last)
