"""Batches in Redis: the record a client polls, the input copy, and the results line by line.

A batch is one hash: `object` (its BatchParams, written once), `status`, and each changing field
(timestamps, file ids, `errors`, `total`) on its own, so the gateway (cancel) and the batch task never
overwrite each other's writes; a status change is a compare-and-set in one script. Results go to two
hashes keyed by line index (output lines, error lines): `request_counts` are their sizes, and a task
that runs the batch again skips the lines already there. Every key expires at the params'
`retain_until`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import msgspec
import redis.asyncio as aioredis

from common.redis_io.redis_conn import as_bytes, as_str
from common.streams import (
    ACTIVE_BATCHES,
    batch_attempts,
    batch_errors,
    batch_input,
    batch_key,
    batch_outputs,
    file_key,
    owner_batches,
)
from openai_frontend.batch.objects import BatchParams, BatchState, Status, decode_params
from openai_frontend.batch.owner_index import page

_OBJECT, _STATUS = "object", "status"

# Copy the input file's content to the batch's own key. KEYS: file hash, input key. ARGV: expiry.
_COPY_INPUT = """
local content = redis.call('HGET', KEYS[1], 'content')
if not content then return 0 end
redis.call('SET', KEYS[2], content, 'EXAT', ARGV[1])
return 1
"""

# Set status (and fields) only from one of the given statuses. KEYS: batch hash.
# ARGV: n, n allowed statuses, the new status, then field / value pairs.
_TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
local n = tonumber(ARGV[1])
for i = 2, n + 1 do
  if status == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', unpack(ARGV, n + 2))
    return 1
  end
end
return 0
"""


class BatchStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def create(self, params: BatchParams) -> bool:
        """Record a new batch (status `validating`) with a copy of its input; False if the file is gone."""
        copied = await self._redis.eval(
            _COPY_INPUT, 2, file_key(params.input_file_id), batch_input(params.id), params.retain_until
        )
        if not copied:
            return False
        key = batch_key(params.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={_OBJECT: msgspec.json.encode(params), _STATUS: "validating"})
            pipe.expireat(key, params.retain_until)
            pipe.zadd(owner_batches(params.owner), {params.id: time.time()})
            pipe.zadd(ACTIVE_BATCHES, {params.id: time.time()})  # for the reaper (cbserve_celery)
            await pipe.execute()
        return True

    async def get(self, batch_id: str, owner: str | None = None) -> BatchState | None:
        """The batch, or None when unknown, expired, or (with `owner`) another key's."""
        states = await self._load([batch_id])
        state = states[0]
        if state is None or (owner is not None and state.params.owner != owner):
            return None
        return state

    async def _load(self, batch_ids: list[str]) -> list[BatchState | None]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for batch_id in batch_ids:
                pipe.hgetall(batch_key(batch_id))
                pipe.hlen(batch_outputs(batch_id))
                pipe.hlen(batch_errors(batch_id))
            replies = await pipe.execute()
        states: list[BatchState | None] = []
        for i in range(0, len(replies), 3):
            raw, num_completed, num_failed = replies[i : i + 3]
            fields = {as_str(k): as_str(v) for k, v in raw.items() if as_str(k) != _OBJECT}
            if _OBJECT.encode() not in raw:
                states.append(None)
                continue
            params = decode_params(raw[_OBJECT.encode()])
            status: Status = fields.pop(_STATUS)  # type: ignore[assignment]
            states.append(BatchState(params, status, fields, int(num_completed), int(num_failed)))
        return states

    async def listing(self, owner: str, *, after: str | None, limit: int) -> tuple[list[BatchState], bool]:
        return await page(self._redis, owner_batches(owner), self._load, after=after, limit=limit)

    async def transition(
        self, batch_id: str, allowed: Iterable[Status], to: Status, **fields: str | int
    ) -> bool:
        """Move to `to` (and set `fields`) only from one of `allowed`; False when the status was another."""
        frm = list(allowed)
        pairs = [str(x) for kv in fields.items() for x in kv]
        moved = await self._redis.eval(_TRANSITION, 1, batch_key(batch_id), len(frm), *frm, to, *pairs)
        return bool(moved)

    async def input(self, batch_id: str) -> bytes | None:
        raw = await self._redis.get(batch_input(batch_id))
        return None if raw is None else as_bytes(raw)

    async def record(self, params: BatchParams, index: int, ok: bool, line: bytes) -> None:
        """Keep a line's result, unless one is kept already (a result is written once)."""
        key = batch_outputs(params.id) if ok else batch_errors(params.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(key, str(index), line)
            pipe.expireat(key, params.retain_until)
            await pipe.execute()

    async def done(self, batch_id: str) -> set[int]:
        """Indexes of the lines that have a result."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hkeys(batch_outputs(batch_id))
            pipe.hkeys(batch_errors(batch_id))
            outs, errs = await pipe.execute()
        return {int(i) for i in [*outs, *errs]}

    async def results(self, batch_id: str, ok: bool) -> list[bytes]:
        """The output (or error) lines in input order."""
        raw = await self._redis.hgetall(batch_outputs(batch_id) if ok else batch_errors(batch_id))
        return [as_bytes(line) for _, line in sorted(raw.items(), key=lambda kv: int(kv[0]))]

    async def status(self, batch_id: str) -> Status | None:
        raw = await self._redis.hget(batch_key(batch_id), _STATUS)
        return None if raw is None else as_str(raw)  # type: ignore[return-value]

    async def statuses(self, batch_ids: list[str]) -> list[Status | None]:
        """Each batch's status, None for one unknown or expired."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for batch_id in batch_ids:
                pipe.hget(batch_key(batch_id), _STATUS)
            replies = await pipe.execute()
        return [None if raw is None else as_str(raw) for raw in replies]  # type: ignore[misc]

    async def attempts(self, batch_id: str) -> dict[int, int]:
        """Line index -> attempt, for the lines whose result was lost before (usually none)."""
        raw = await self._redis.hgetall(batch_attempts(batch_id))
        return {int(k): int(v) for k, v in raw.items()}

    async def next_attempt(self, params: BatchParams, index: int) -> int:
        """A line whose result was lost (see common/redis_io/result_lost.py) runs again under a new id."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(batch_attempts(params.id), str(index), 1)
            pipe.expireat(batch_attempts(params.id), params.retain_until)
            attempt, _ = await pipe.execute()
        return int(attempt)
