"""The batcher's busy loop: receive (requests, results, aborts), schedule, send (one step per worker)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import msgspec
import redis

from batcher import recovery
from batcher.follow_leases import LeaseReaper
from batcher.lease import Lease, LeaseLost
from batcher.metrics import BatcherMetrics
from batcher.request import Request
from batcher.retention import StreamTrimmer
from batcher.scheduler import Scheduler, SchedulerConfig
from batcher.settings import BatcherSettings
from batcher.step_trace import step_trace
from batcher.worker_state import WorkerState
from common import streams
from common.protocol import (
    FIELD,
    AbortRequest,
    ModelRunnerOutput,
    RequestError,
    SchedulerOutput,
    WorkerInfo,
    WorkerLost,
    decode_inbox,
    decode_request,
    decode_worker,
    encode,
)
from common.redis_conn import MAX_BLOCK_MS, min_id
from common.trace_schema import encode_trace

log = logging.getLogger("batcher")

# Requests claimed from the stream per read; the rest wait for the next iteration.
READ_COUNT = 512
_ABORTED = "the request was aborted by the gateway (its client left without resuming, or it timed out)"


class Batcher:
    def __init__(
        self, settings: BatcherSettings, client: redis.Redis, lease: Lease, after_outage: bool = False
    ) -> None:
        self.settings = settings
        # Redis was unreachable since the last leader's state was built: rebuild as on a takeover.
        self.after_outage = after_outage
        self.redis = client
        self.lease = lease  # held: this is the active batcher (batcher/leader.py); LeaseLost ends run()
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=settings.max_num_seqs,
                max_num_batched_tokens=settings.max_num_batched_tokens,
                policy=settings.policy,
                waiting_served_ratio=settings.waiting_served_ratio,
                max_waiting_tokens=settings.max_waiting_tokens,
                async_scheduling=settings.async_scheduling,
                max_deliveries=settings.max_deliveries,
            )
        )
        self.metrics = BatcherMetrics(self.scheduler)
        self._pipe = client.pipeline(transaction=False)
        self._inbox_id = "0-0"
        self._requests_seen_id = "0-0"
        self._next_worker_check = 0.0
        self._stats_dirty = True
        self._steps: list[tuple[str, bytes]] = []  # (steps stream, encoded step) to send, fenced
        self.num_recovered = 0  # requests rebuilt from Redis when this batcher took over
        self._trimmer = StreamTrimmer(settings.retention_s)
        self._reaper = LeaseReaper()

    # ----- lifecycle -----------------------------------------------------------------------------
    def setup(self) -> None:
        try:
            self.redis.xgroup_create(streams.REQUESTS_STREAM, streams.BATCHER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        if self.lease.epoch > 1 or self.after_outage:
            # An earlier batcher ran (or this one, before a Redis outage): its steps may still be in
            # the workers. Fenced first, so that the token streams read next are final and nothing
            # of the old state can land later. After an outage the epoch alone is no guide: a Redis
            # killed with AOF everysec may have lost the last second's INCR of it.
            fenced = recovery.fence_workers(self.redis)
            log.info("fenced the workers of the previous batcher: %s", fenced)
        self._inbox_id = self._last_id(streams.BATCHER_INBOX)
        self._requests_seen_id = self._last_id(streams.REQUESTS_STREAM)
        self._recover(recovery.claim_pending(self.redis, self.settings.batcher_id), replay_aborts=True)
        # Every pending entry is ours now: the names of earlier batchers would only accumulate.
        recovery.drop_idle_consumers(self.redis, self.settings.batcher_id)
        self._claim_requests()  # whatever arrived before we started
        self.check_workers(time.time())
        self._reaper.settle(time.time())

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set; raises LeaseLost when another batcher took over."""
        self.setup()
        log.info("batcher %s active (epoch %d)", self.settings.batcher_id, self.lease.epoch)
        while not stop.is_set():
            self.step()
        log.info("batcher %s stopped", self.settings.batcher_id)

    def _recover(self, entries: list[recovery.Entry], replay_aborts: bool = False) -> None:
        """Take in claimed pending entries as they stand in their token streams."""
        if not entries:
            return
        histories = recovery.read_histories(self.redis, [_req_id(fields) for _, fields in entries])
        if replay_aborts:
            # Aborts the old leader may not have applied (early ones are kept until their request).
            since_ms = int(entries[0][0].split("-")[0]) - 5000
            for abort in recovery.aborts_since(self.redis, f"{max(since_ms, 0)}-0", self._inbox_id):
                self._abort(abort.req_id, abort.reason)
        now = time.time()
        for entry_id, fields in entries:
            self._take(entry_id, fields, now, histories.get(_req_id(fields)))
        self.num_recovered += len(entries)
        log.info("recovered %d pending requests from Redis", len(entries))

    def step(self) -> None:
        """One iteration of the busy loop."""
        self.receive()
        now = time.time()
        if now >= self._next_worker_check:
            self.check_workers(now)
            # A safety net under the XREAD wake-up: whatever is still unclaimed is taken now.
            self._claim_requests()
            self._recover(recovery.claim_from_others(self.redis, self.settings.batcher_id))
        if self._trimmer.due(now):
            self._trimmer.trim(self.redis, self._inbox_id, now)  # after the claims: they are pending now
        if self._reaper.due(now):
            self._abort_unfollowed(now)
        self._on_finished(self.scheduler.expire_waiting(now))
        self.schedule()
        self.send()

    # ----- receive -------------------------------------------------------------------------------
    def receive(self) -> None:
        """Wait (bounded) for anything addressed to the batcher, then take it in."""
        block_ms = max(1, min(MAX_BLOCK_MS, int((self._next_worker_check - time.time()) * 1000)))
        resp: Any = self.redis.xread(
            {streams.BATCHER_INBOX: self._inbox_id, streams.REQUESTS_STREAM: self._requests_seen_id},
            block=block_ms,
        )
        saw_requests = False
        for name, entries in resp or []:
            if _s(name) == streams.REQUESTS_STREAM:
                self._requests_seen_id = _s(entries[-1][0])
                saw_requests = True
                continue
            for entry_id, fields in entries:
                self._inbox_id = _s(entry_id)
                self._on_inbox(fields)
        if saw_requests:
            self._claim_requests()

    def _claim_requests(self) -> None:
        """Claim every new request; a burst larger than READ_COUNT takes several reads."""
        self.lease.check()  # a batcher that lost the lease must not take requests into its name
        while self._claim_some() == READ_COUNT:
            pass

    def _claim_some(self) -> int:
        resp: Any = self.redis.xreadgroup(
            streams.BATCHER_GROUP,
            self.settings.batcher_id,
            {streams.REQUESTS_STREAM: ">"},
            count=READ_COUNT,
        )
        now = time.time()
        num_read = 0
        for _, entries in resp or []:
            num_read += len(entries)
            for entry_id, fields in entries:
                self._take(_s(entry_id), fields, now, None)
        # Gateways bound the queue by `num_waiting`: publish it as soon as claimed requests leave the lag.
        self._stats_dirty = self._stats_dirty or num_read > 0
        return num_read

    def _take(
        self, entry_id: str, fields: dict[bytes, bytes], now: float, history: recovery.TokenHistory | None
    ) -> None:
        """Queue one entry of the requests stream; `history` is its token stream when recovered."""
        try:
            msg = decode_request(fields[FIELD])
        except (KeyError, msgspec.DecodeError) as e:
            log.warning("dead-lettering malformed request entry %s: %s", entry_id, e)
            self._dead_letter(fields, entry_id, f"unreadable request: {e}", 1)
            self._pipe.xack(streams.REQUESTS_STREAM, streams.BATCHER_GROUP, entry_id)
            return
        req = Request.from_message(msg, entry_id)
        if history is not None:
            if history.finished:  # it ended before the old batcher could acknowledge it
                self._expire_request_keys(req.req_id)
                self._pipe.xack(streams.REQUESTS_STREAM, streams.BATCHER_GROUP, entry_id)
                return
            # Recomputed from prompt + what its client has; readers need a newer attempt than theirs.
            req.output_token_ids = history.output_token_ids
            req.attempt = history.attempt
        self._on_finished(self.scheduler.add_request(req, now))

    def _abort_unfollowed(self, now: float) -> None:
        """Abort the requests whose follow lease ran out: their clients left and nobody resumed."""
        self.lease.check()  # popping leases is a write: only the leader's
        for req_id in self._reaper.pop_expired(self.redis, now):
            if req_id in self.scheduler.requests:
                log.info("no client follows it (lease expired): aborting", extra={"request_id": req_id})
                self._abort(req_id, "abort")

    def _abort(self, req_id: str, reason: str) -> None:
        req = self.scheduler.abort_request(req_id, reason, time.time())
        if req is not None:
            self._on_finished([req])

    def _on_inbox(self, fields: dict[bytes, bytes]) -> None:
        try:
            msg = decode_inbox(fields[FIELD])
        except (KeyError, msgspec.DecodeError) as e:
            log.warning("dropping malformed inbox entry: %s", e)
            return
        if isinstance(msg, ModelRunnerOutput):
            if msg.epoch != self.lease.epoch:
                return  # a step of an earlier leader, computed before its worker was fenced
            if msg.error is not None:
                log.error("worker %s step %d failed: %s", msg.worker_id, msg.step_id, msg.error)
            self.metrics.on_step_result(msg)
            self._on_finished(self.scheduler.update_from_output(msg))
        elif isinstance(msg, AbortRequest):
            self._abort(msg.req_id, msg.reason)
        elif isinstance(msg, WorkerInfo):
            self._add_worker(msg)
        elif isinstance(msg, WorkerLost):
            # Every result the fenced worker managed to write came before this marker: what it streamed
            # is in each request's output_token_ids now, so recomputing resumes exactly after it.
            self._remove_worker(msg.worker_id, msg.reason)

    # ----- workers -------------------------------------------------------------------------------
    def check_workers(self, now: float) -> None:
        """Join workers with a fresh heartbeat; drop those whose heartbeat is too old."""
        self._next_worker_check = now + self.settings.worker_check_interval_s
        self._stats_dirty = True  # refreshes `updated_at`, the batcher's own liveness signal
        beats: Any = self.redis.zrange(streams.WORKERS_HEARTBEAT, 0, -1, withscores=True)
        cutoff_ms = (now - self.settings.heartbeat_timeout_s) * 1000
        alive = {_s(wid) for wid, score in beats if score >= cutoff_ms}
        for worker_id, ws in list(self.scheduler.workers.items()):
            if worker_id not in alive and not ws.fenced:
                self._fence_worker(worker_id)
        for worker_id in alive - self.scheduler.workers.keys():
            raw: Any = self.redis.hget(streams.WORKERS_HASH, worker_id)
            if raw is not None:
                self._add_worker(decode_worker(raw))

    def _add_worker(self, info: WorkerInfo) -> None:
        if info.worker_id in self.scheduler.workers:
            return
        self.scheduler.add_worker(info)
        self._stats_dirty = True
        log.info(
            "worker %s joined: %d blocks of %d tokens, max_model_len %d",
            info.worker_id,
            info.num_blocks,
            info.block_size,
            info.max_model_len,
        )

    def _fence_worker(self, worker_id: str) -> None:
        """Declare a worker dead: revoke its registration, which every write of the worker checks
        atomically (gpu_worker/fence.py), then post a WorkerLost marker behind its last results."""
        self.scheduler.fence_worker(worker_id)
        self._pipe.hdel(streams.WORKERS_HASH, worker_id)
        self._pipe.zrem(streams.WORKERS_HEARTBEAT, worker_id)
        self._pipe.delete(streams.worker_steps(worker_id))
        marker = WorkerLost(worker_id=worker_id, reason="no heartbeat or deregistered")
        self._pipe.xadd(
            streams.BATCHER_INBOX, {FIELD: encode(marker)}, minid=self._min_id(), approximate=True
        )
        self._stats_dirty = True
        log.warning("worker %s missed its heartbeat: fenced", worker_id)

    def _remove_worker(self, worker_id: str, reason: str) -> None:
        orphans = self.scheduler.remove_worker(worker_id)
        self._pipe.hdel(streams.BATCHER_STATS, f"num_steps:{worker_id}")
        self._stats_dirty = True
        log.warning(
            "worker %s is gone (%s); %d requests will be recomputed elsewhere",
            worker_id,
            reason,
            len(orphans),
        )

    # ----- schedule and send ---------------------------------------------------------------------
    def schedule(self) -> None:
        """Build the next step of every worker that has room for one (two with async scheduling)."""
        max_in_flight = self.scheduler.config.max_steps_in_flight
        for worker_id, ws in self.scheduler.workers.items():
            while len(ws.in_flight) < max_in_flight:
                out, failed = self.scheduler.schedule(worker_id)
                self._on_finished(failed)
                if out is None:
                    break
                out.epoch = self.lease.epoch
                self._steps.append((streams.worker_steps(worker_id), encode(out)))
                now = time.time()
                self.metrics.on_step_sent(worker_id, out, now)
                self._trace(ws, out, now)
                self._stats_dirty = True

    def _trace(self, ws: WorkerState, out: SchedulerOutput, now: float) -> None:
        """One XADD per step on the pipeline `send` executes anyway: no extra round trip."""
        if self.settings.trace_maxlen:
            trace = encode_trace(step_trace(ws, out, len(self.scheduler.waiting), now))
            maxlen = self.settings.trace_maxlen
            self._pipe.xadd(streams.BATCHER_TRACE, {FIELD: trace}, maxlen=maxlen, approximate=True)

    def send(self) -> None:
        """Everything queued this iteration in one round trip; the steps only while we hold the lease."""
        self.lease.check()
        if self._stats_dirty:
            self._pipe.hset(streams.BATCHER_STATS, mapping=self._stats())  # type: ignore[arg-type]
            self._stats_dirty = False
        self.metrics.publish(self._pipe, time.time())
        steps_sent = None
        if self._steps:
            steps_sent = self.lease.queue_steps(self._pipe, self._steps, self._min_id())
            self._steps = []
        if not len(self._pipe):
            return
        results = self._pipe.execute(raise_on_error=False)
        for result in results[:-1] if steps_sent else results:
            if isinstance(result, Exception):
                raise result
        if steps_sent is not None and not steps_sent(results[-1]):
            raise LeaseLost(f"batcher {self.settings.batcher_id}: steps refused, the lease has moved on")

    def _on_finished(self, finished: list[Request]) -> None:
        for req in finished:
            log.debug("request finished (%s)", req.finish_reason, extra={"request_id": req.req_id})
            key = streams.token_stream(req.req_id)
            if req.finish_reason == "error":
                event = RequestError(
                    req_id=req.req_id, message=req.error or "request failed", code=req.error_code
                )
                self._pipe.xadd(key, {FIELD: encode(event)})
            elif req.finish_reason == "abort":
                # Its client left and nobody resumed it: a late reader (resume, fetch) learns so at once.
                event = RequestError(req_id=req.req_id, message=_ABORTED, code="request_aborted")
                self._pipe.xadd(key, {FIELD: encode(event)})
            self._expire_request_keys(req.req_id)
            if req.dead_letter:
                fields = {FIELD: encode(req.to_message())}
                self._dead_letter(fields, req.entry_id, req.error or "", req.num_failed_deliveries)
            self._pipe.xack(streams.REQUESTS_STREAM, streams.BATCHER_GROUP, req.entry_id)
            self._stats_dirty = True

    def _min_id(self) -> str:
        return min_id(self.settings.retention_s)

    def _expire_request_keys(self, req_id: str) -> None:
        """The request is over: its token stream (the worker sets its TTL with a last token; an aborted
        or failed one has none), the gateway's metadata (whose TTL covered the request timeout) and a
        submit_once marker (24 h) all stay only for the resume window, whoever followed the request."""
        for key in streams.request_keys(req_id):
            self._pipe.expire(key, self.settings.retention_s)

    def _dead_letter(self, fields: dict[bytes, bytes], entry_id: str, error: str, deliveries: int) -> None:
        """Keep a given-up request for operators: its original fields plus why and how often it failed."""
        entry: dict[bytes, bytes | str | int] = {
            **fields,
            b"entry_id": entry_id,
            b"error": error,
            b"deliveries": deliveries,
        }
        self._pipe.xadd(streams.DEAD_LETTER_STREAM, entry, minid=self._min_id(), approximate=True)  # type: ignore[arg-type]

    def _stats(self) -> dict[str, Any]:
        s = self.scheduler
        stats: dict[str, Any] = dataclasses.asdict(s.stats)
        stats.update(
            num_waiting=len(s.waiting),
            # What delays a new interactive request: batch lines (priority 1) wait behind it.
            num_waiting_interactive=s.waiting.count(0),
            num_running=s.num_running,
            num_workers=len(s.workers),
            epoch=self.lease.epoch,
            num_recovered=self.num_recovered,
            **{f"num_steps:{wid}": ws.step_id for wid, ws in s.workers.items()},
            updated_at=time.time(),
        )
        return stats

    def _last_id(self, stream: str) -> str:
        try:
            info = self.redis.xinfo_stream(stream)
        except redis.ResponseError:
            return "0-0"  # no such stream yet
        return _s(info["last-generated-id"])


def _req_id(fields: dict[bytes, bytes]) -> str:
    """The req_id of a requests-stream entry without failing on a malformed one (handled later)."""
    try:
        return decode_request(fields[FIELD]).req_id
    except (KeyError, msgspec.DecodeError):
        return ""


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
