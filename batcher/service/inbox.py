"""What the batcher reads: new requests (claimed in its consumer group), and its inbox of step
results, aborts, worker registrations and WorkerLost markers; recovered entries go in the same way."""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec
import redis

from batcher.core.request import Request
from batcher.service import recovery
from batcher.service.context import BatcherContext, ContextPart
from batcher.service.housekeeping import Housekeeping
from batcher.service.metrics import BatcherMetrics
from common import streams
from common.protocol import (
    FIELD,
    AbortRequest,
    ModelRunnerOutput,
    WorkerInfo,
    WorkerLost,
    decode_inbox,
    decode_request,
)
from common.redis_io.redis_conn import MAX_BLOCK_MS, as_str
from common.redis_io.retry import REDIS_DOWN

log = logging.getLogger("batcher")

# Requests claimed from the stream per read; the rest wait for the next iteration.
READ_COUNT = 512
# How late Redis may end a blocked read (1/hz of its default hz), and how often to read instead
# while a step's plan time is closer than that.
_REDIS_TIMER_S = 0.1
_POLL_S = 0.001


class Inbox(ContextPart):
    def __init__(self, ctx: BatcherContext, metrics: BatcherMetrics, housekeeping: Housekeeping) -> None:
        super().__init__(ctx)
        self.metrics = metrics
        self.housekeeping = housekeeping
        self.inbox_id = "0-0"  # the last inbox entry read
        self._requests_seen_id = "0-0"  # the last requests-stream entry XREAD woke up for
        self.num_recovered = 0  # requests rebuilt from Redis when this batcher took over

    def start_at_the_end(self) -> None:
        """Read only what arrives from now on (what came before is recovered, not replayed)."""
        self.inbox_id = self._last_id(self.keys.inbox)
        self._requests_seen_id = self._last_id(self.keys.requests)

    def receive(self, until: float, precise: bool = False) -> None:
        """Wait (bounded, at most until `until`) for anything addressed to the batcher, then take it
        in. `precise`: `until` is a step's plan time, to be kept within a millisecond or so."""
        left_s = until - time.time()
        # Redis ends a blocked read at its timeout only when its event loop next wakes (up to 1/hz s
        # late, 100 ms by default): a plan time is waited for by blocking until that much before
        # it, then by reads that do not block and sleeps here.
        blocking_s = left_s - _REDIS_TIMER_S if precise else left_s
        polls = precise and blocking_s < 0
        block_ms = None if polls else max(1, min(MAX_BLOCK_MS, int(blocking_s * 1000)))
        resp: Any = self.redis.xread(
            {self.keys.inbox: self.inbox_id, self.keys.requests: self._requests_seen_id},
            block=block_ms,
        )
        if not resp and polls:
            time.sleep(min(max(left_s, 0.0), _POLL_S))
        saw_requests = False
        for name, entries in resp or []:
            if as_str(name) == self.keys.requests:
                self._requests_seen_id = as_str(entries[-1][0])
                saw_requests = True
                continue
            for entry_id, fields in entries:
                self.inbox_id = as_str(entry_id)
                self._on_inbox(fields)
        if saw_requests:
            self.claim_requests()

    def claim_requests(self) -> None:
        """Claim every new request; a burst larger than READ_COUNT takes several reads."""
        self.leadership.check()  # a batcher no longer leading must not take requests into its name
        while self._claim_some() == READ_COUNT:
            pass

    def _claim_some(self) -> int:
        resp: Any = self.redis.xreadgroup(
            streams.BATCHER_GROUP,
            self.settings.batcher_id,
            {self.keys.requests: ">"},
            count=READ_COUNT,
        )
        now = time.time()
        num_read = 0
        for _, entries in resp or []:
            num_read += len(entries)
            for entry_id, fields in entries:
                self._take(as_str(entry_id), fields, now, None)
        # Gateways bound the queue by `num_waiting`: publish it as soon as claimed requests leave the lag.
        self.outbox.stats_dirty = self.outbox.stats_dirty or num_read > 0
        return num_read

    def recover(self, entries: list[recovery.Entry], replay_aborts: bool = False) -> None:
        """Take in claimed pending entries as they stand in their token streams."""
        if not entries:
            return
        histories = recovery.read_histories(self.redis, [_req_id(fields) for _, fields in entries])
        if replay_aborts:
            # Aborts the old leader may not have applied (early ones are kept until their request).
            since_ms = int(entries[0][0].split("-")[0]) - 5000
            for abort in recovery.aborts_since(self.redis, self.keys, f"{max(since_ms, 0)}-0", self.inbox_id):
                self._abort(abort.req_id, abort.reason)
        now = time.time()
        for entry_id, fields in entries:
            self._take(entry_id, fields, now, histories.get(_req_id(fields)))
        self.num_recovered += len(entries)
        log.info("recovered %d pending requests from Redis", len(entries))

    def _take(
        self, entry_id: str, fields: dict[bytes, bytes], now: float, history: recovery.TokenHistory | None
    ) -> None:
        """Queue one entry of the requests stream; `history` is its token stream when recovered."""
        pipe = self.outbox.pipe
        try:
            msg = decode_request(fields[FIELD])
        except (KeyError, msgspec.DecodeError) as e:
            log.warning("dead-lettering malformed request entry %s: %s", entry_id, e)
            self.outbox.dead_letter(fields, entry_id, f"unreadable request: {e}", 1)
            pipe.xack(self.keys.requests, streams.BATCHER_GROUP, entry_id)
            return
        placed_in = streams.cell_of(msg.req_id)
        if placed_in != self.keys.cell:
            # Its keys are in another cell's slot, where this cell's workers cannot write atomically.
            error = f"request {msg.req_id!r} is placed in cell {placed_in!r}, not {self.keys.cell!r}"
            log.warning("dead-lettering %s", error)
            self.outbox.dead_letter(fields, entry_id, error, 1)
            pipe.xack(self.keys.requests, streams.BATCHER_GROUP, entry_id)
            return
        req = Request.from_message(msg, entry_id)
        if history is not None:
            if history.finished:  # it ended before the old batcher could acknowledge it
                self.outbox.expire_request_keys(req.req_id)
                pipe.xack(self.keys.requests, streams.BATCHER_GROUP, entry_id)
                return
            # Recomputed from prompt + what its client has; readers need a newer attempt than theirs.
            req.output_token_ids = history.output_token_ids
            req.attempt = history.attempt
        self.outbox.finished(self.scheduler.add_request(req, now))

    def _abort(self, req_id: str, reason: str) -> None:
        req = self.scheduler.abort_request(req_id, reason, time.time())
        if req is not None:
            self.outbox.finished([req])

    def _on_inbox(self, fields: dict[bytes, bytes]) -> None:
        try:
            msg = decode_inbox(fields[FIELD])
        except (KeyError, msgspec.DecodeError) as e:
            log.warning("dropping malformed inbox entry: %s", e)
            return
        if isinstance(msg, ModelRunnerOutput):
            if msg.epoch != self.leadership.epoch:
                return  # a step of an earlier leader, computed before its worker was fenced
            self.metrics.on_step_result(msg)
            ws = self.scheduler.workers.get(msg.worker_id)
            num_in_flight = len(ws.in_flight) if ws is not None else 0
            self.outbox.finished(self.scheduler.update_from_output(msg))
            if ws is not None and len(ws.in_flight) < num_in_flight:
                ws.clock.on_result(time.time(), len(ws.in_flight))
        elif isinstance(msg, AbortRequest):
            self._abort(msg.req_id, msg.reason)
        elif isinstance(msg, WorkerInfo):
            self.housekeeping.add_worker(msg)
        elif isinstance(msg, WorkerLost):
            # Every result the fenced worker managed to write came before this marker: what it streamed
            # is in each request's output_token_ids now, so recomputing resumes exactly after it.
            self.housekeeping.remove_worker(msg.worker_id, msg.reason)

    def _last_id(self, stream: str) -> str:
        try:
            info = self.redis.xinfo_stream(stream)
        except REDIS_DOWN:
            raise  # CLUSTERDOWN is a ResponseError too: not "no stream", which would replay the inbox
        except redis.ResponseError:
            return "0-0"  # no such stream yet
        return as_str(info["last-generated-id"])


def _req_id(fields: dict[bytes, bytes]) -> str:
    """The req_id of a requests-stream entry without failing on a malformed one (handled later)."""
    try:
        return decode_request(fields[FIELD]).req_id
    except (KeyError, msgspec.DecodeError):
        return ""
