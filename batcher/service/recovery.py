"""What a batcher that takes over reads back from Redis: the source of truth for every request.

A request is acknowledged only when it has finished, so every unfinished one is in the consumer
group's pending list, whoever claimed it; the tokens its client was already sent are in its token
stream. Taking over is: fence every worker (so that no write from the old leader's steps can land
after this point), claim every pending entry, and read each one's token stream to know how far it
got. The scheduler then recomputes the KV cache of prompt + those tokens, as after a worker failover.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
import redis

from common import streams
from common.protocol import (
    FIELD,
    AbortRequest,
    PoolingEvent,
    PromptEvent,
    RequestError,
    TokenEvent,
    decode_event,
    decode_inbox,
)

# Entries claimed / token streams read per round trip.
CHUNK = 256

Entry = tuple[str, dict[bytes, bytes]]  # (entry id in the requests stream, its fields)
M = TypeVar("M")


@dataclass(slots=True)
class TokenHistory:
    """What a request's token stream says about it."""

    output_token_ids: list[int] = field(default_factory=list)  # indexes 0..n-1, as streamed
    attempt: int = 0  # the newest attempt that wrote; the next one must be newer for readers
    finished: bool = False  # a last token or an error is on the stream: only the ack is missing


def fence_workers(client: redis.Redis, keys: streams.CellKeys) -> list[str]:
    """Revoke every worker's registration (see gpu_worker/service/fenced_writes.py) and drop its steps stream.

    A worker holds requests (and KV) from the old leader's steps and may be computing one; once
    fenced, none of that can reach a token stream, and the worker joins again under a new id with an
    empty pool. Its requests' token streams are final from here on, so reading them is exact.
    """
    raw: Any = client.hkeys(keys.workers)
    worker_ids = [_s(w) for w in raw]
    if worker_ids:
        pipe = client.pipeline(transaction=True)
        pipe.hdel(keys.workers, *worker_ids)
        pipe.zrem(keys.heartbeat, *worker_ids)
        pipe.delete(*(keys.worker_steps(w) for w in worker_ids))
        pipe.hdel(keys.stats, *(f"num_steps:{w}" for w in worker_ids))
        pipe.execute()
    return worker_ids


def claim_pending(client: redis.Redis, keys: streams.CellKeys, consumer: str) -> list[Entry]:
    """Claim every pending entry of the group, whichever consumer (a dead batcher, or this one's own
    name on a restart) holds it, oldest first."""
    entries: list[Entry] = []
    start = "0-0"
    while True:
        resp: Any = client.xautoclaim(
            keys.requests, streams.BATCHER_GROUP, consumer, 0, start_id=start, count=CHUNK
        )
        start = _s(resp[0])
        # Entries trimmed from the stream come back without fields (Redis 7 drops them from the list).
        entries += [(_s(eid), fields) for eid, fields in resp[1] if fields]
        if start == "0-0":
            return entries


def drop_idle_consumers(client: redis.Redis, keys: streams.CellKeys, keep: str) -> list[str]:
    """Delete the group's consumers other than `keep` that hold nothing: the names of batchers that
    ran before (one per process, `host-pid`), which would otherwise pile up with every restart."""
    rows: Any = client.xinfo_consumers(keys.requests, streams.BATCHER_GROUP)
    idle = [_s(row["name"]) for row in rows if _s(row["name"]) != keep and not row["pending"]]
    if idle:
        pipe = client.pipeline(transaction=False)
        for name in idle:
            pipe.xgroup_delconsumer(keys.requests, streams.BATCHER_GROUP, name)
        pipe.execute()
    return idle


def claim_from_others(client: redis.Redis, keys: streams.CellKeys, consumer: str) -> list[Entry]:
    """Claim entries that other consumers hold. Only the leader reads the group, but an old leader
    waking from a pause can read a few entries before it finds out it lost the lease."""
    summary: Any = client.xpending(keys.requests, streams.BATCHER_GROUP)
    others = [_s(c["name"]) for c in summary.get("consumers") or [] if _s(c["name"]) != consumer]
    if not others:
        return []
    ids: list[Any] = []
    for other in others:
        rows: Any = client.xpending_range(
            keys.requests, streams.BATCHER_GROUP, "-", "+", 10_000, consumername=other
        )
        ids += [_s(r["message_id"]) for r in rows]
    entries: list[Entry] = []
    for i in range(0, len(ids), CHUNK):
        chunk = ids[i : i + CHUNK]
        resp: Any = client.xclaim(keys.requests, streams.BATCHER_GROUP, consumer, 0, chunk)
        entries += [(_s(eid), fields) for eid, fields in resp if fields]
    return entries


def read_histories(client: redis.Redis, req_ids: list[str]) -> dict[str, TokenHistory]:
    """Each request's token stream, one pipelined round trip per CHUNK requests."""
    out: dict[str, TokenHistory] = {}
    for i in range(0, len(req_ids), CHUNK):
        chunk = req_ids[i : i + CHUNK]
        pipe = client.pipeline(transaction=False)
        for req_id in chunk:
            pipe.xrange(streams.token_stream(req_id))
        for req_id, rows in zip(chunk, pipe.execute(), strict=True):
            out[req_id] = _history(rows)
    return out


def _decoded(rows: list[tuple[bytes, dict[bytes, bytes]]], decode: Callable[[bytes], M]) -> Iterator[M]:
    """The message of each entry; one that has no message field or does not decode is skipped."""
    for _, fields in rows:
        try:
            yield decode(fields[FIELD])
        except (KeyError, msgspec.DecodeError):
            continue


def _history(rows: list[tuple[bytes, dict[bytes, bytes]]]) -> TokenHistory:
    h = TokenHistory()
    for event in _decoded(rows, decode_event):
        if isinstance(event, RequestError | PoolingEvent):
            h.finished = True  # failed, or a pooling request's one result is out
        elif isinstance(event, PromptEvent):
            h.finished = h.finished or event.finish_reason is not None  # max_tokens 0: no token
        elif isinstance(event, TokenEvent) and event.index == len(h.output_token_ids):
            h.output_token_ids.append(event.token_id)
            h.attempt = max(h.attempt, event.attempt)
            h.finished = h.finished or event.finish_reason is not None
    return h


def aborts_since(
    client: redis.Redis, keys: streams.CellKeys, first_id: str, last_id: str
) -> Iterator[AbortRequest]:
    """Aborts in the inbox between two ids: those the old leader may not have applied. Bounded by
    the oldest pending request (an abort comes after its request, give or take a few ms)."""
    start = first_id
    while True:
        rows: Any = client.xrange(keys.inbox, start, last_id, count=CHUNK * 4)
        for msg in _decoded(rows, decode_inbox):
            if isinstance(msg, AbortRequest):
                yield msg
        if len(rows) < CHUNK * 4:
            return
        start = "(" + _s(rows[-1][0])


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
