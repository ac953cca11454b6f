"""What the batcher publishes per step for the dashboard (`llm:batcher:trace`): one worker's batch.

JSON, not msgpack: the one reader is the gateway, which relays each entry to browsers byte for byte,
and `redis-cli XRANGE` stays readable. Requests are named by a short id, never their req_id: anyone
holding a req_id may read its token stream, and dashboard viewers are not the requests' owners.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# Characters of the req_id that name it on the dashboard: 32 of its 128 random bits, leaving 96 unknown.
SHORT_ID_LEN = 8

# "p": a prefill chunk (of the prompt, or a recompute after preemption or failover); "d": a decode;
# "w": in the batch and holding KV blocks, but computing nothing in this step (e.g. TGI's prefill steps).
TraceKind = Literal["p", "d", "w"]


class TracedRequest(msgspec.Struct, array_like=True):
    """One request of the batch, encoded as a JSON array `[id, kind, num_tokens]`."""

    id: str  # short_id(req_id)
    kind: TraceKind
    num_tokens: int  # tokens computed for it in this step (0 for "w")


class StepTrace(msgspec.Struct, kw_only=True):
    worker_id: str
    step_id: int  # the worker's step counter, as in its SchedulerOutput
    time: float  # unix seconds when the batcher scheduled the step
    reqs: list[TracedRequest]  # the worker's whole batch after scheduling, in admission order
    num_sampled: int  # requests that sample a token in this step (decodes and last prefill chunks)
    num_blocks_used: int  # the worker's KV-cache blocks held after scheduling
    num_blocks: int  # the worker's whole pool
    num_blocks_cached: int = 0  # free blocks still holding a reusable prefix
    num_waiting: int  # requests in the shared waiting queue after scheduling


def short_id(req_id: str) -> str:
    """The tail of a req_id; a client that knows its request's id (X-Request-Id) can find it."""
    return req_id[-SHORT_ID_LEN:]


encode_trace = msgspec.json.Encoder().encode
decode_trace = msgspec.json.Decoder(StepTrace).decode
