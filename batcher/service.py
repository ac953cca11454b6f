"""The batcher's busy loop: receive (requests, results, aborts), schedule, send (one step per worker).

Reading is batcher/inbox.py, the writes about finished requests batcher/outbox.py, the periodic
chores (heartbeats, trims, follow deadlines, queue deadlines) batcher/housekeeping.py, what a new
leader reads back batcher/recovery.py, and every scheduling decision batcher/scheduler.py.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import redis

from batcher import recovery
from batcher.context import BatcherContext
from batcher.housekeeping import Housekeeping
from batcher.inbox import Inbox
from batcher.leadership import Leadership, LeadershipLost
from batcher.metrics import BatcherMetrics
from batcher.outbox import Outbox
from batcher.scheduler import Scheduler, SchedulerConfig
from batcher.settings import BatcherSettings
from batcher.step_trace import step_trace
from batcher.worker_state import WorkerState
from common import streams
from common.protocol import FIELD, SchedulerOutput, encode
from common.trace_schema import encode_trace

log = logging.getLogger("batcher")


class Batcher:
    def __init__(
        self,
        settings: BatcherSettings,
        client: redis.Redis,
        leadership: Leadership,
        after_outage: bool = False,
    ) -> None:
        self.settings = settings
        # Redis was unreachable since the last leader's state was built: rebuild as on a takeover.
        self.after_outage = after_outage
        self.redis = client
        self.leadership = (
            leadership  # held: the active batcher (batcher/leader.py); LeadershipLost ends run()
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=settings.max_num_seqs,
                max_num_batched_tokens=settings.max_num_batched_tokens,
                policy=settings.policy,
                waiting_served_ratio=settings.waiting_served_ratio,
                max_waiting_tokens=settings.max_waiting_tokens,
                async_scheduling=settings.async_scheduling,
                max_deliveries=settings.max_deliveries,
                enable_prefix_caching=settings.enable_prefix_caching,
                cache_overlap_weight=settings.cache_overlap_weight,
                prefix_wait=settings.prefix_wait,
                waiting_order=settings.waiting_order,
            )
        )
        self.metrics = BatcherMetrics(self.scheduler)
        self.keys = streams.cell_keys(settings.cell)
        self._pipe = client.pipeline(transaction=False)
        self.outbox = Outbox(self._pipe, settings.retention_s, self.keys)
        ctx = BatcherContext(settings, client, leadership, self.scheduler, self.outbox)
        self.housekeeping = Housekeeping(ctx)
        self.inbox = Inbox(ctx, self.metrics, self.housekeeping)
        self._steps: list[tuple[str, bytes]] = []  # (steps stream, encoded step) to send, fenced
        self._next_plan_at = float("inf")  # the earliest deferred async step is planned then

    @property
    def num_recovered(self) -> int:
        """Requests rebuilt from Redis when this batcher took over."""
        return self.inbox.num_recovered

    # ----- lifecycle -----------------------------------------------------------------------------
    def setup(self) -> None:
        try:
            self.redis.xgroup_create(self.keys.requests, streams.BATCHER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise
        if self.leadership.epoch > 1 or self.after_outage:
            # An earlier batcher ran (or this one, before a Redis outage): its steps may still be in
            # the workers. Fenced first, so that the token streams read next are final and nothing
            # of the old state can land later. After an outage the epoch alone is no guide: a Redis
            # killed with AOF everysec may have lost the last second's INCR of it.
            fenced = recovery.fence_workers(self.redis, self.keys)
            log.info("fenced the workers of the previous batcher: %s", fenced)
        self.inbox.start_at_the_end()
        pending = recovery.claim_pending(self.redis, self.keys, self.settings.batcher_id)
        self.inbox.recover(pending, replay_aborts=True)
        # Every pending entry is ours now: the names of earlier batchers would only accumulate.
        recovery.drop_idle_consumers(self.redis, self.keys, self.settings.batcher_id)
        self.inbox.claim_requests()  # whatever arrived before we started
        self.housekeeping.check_workers(time.time())
        self.housekeeping.settle(time.time())

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set; raises LeadershipLost when another batcher took over."""
        self.setup()
        log.info("batcher %s active (epoch %d)", self.settings.batcher_id, self.leadership.epoch)
        while not stop.is_set():
            self.step()
        log.info("batcher %s stopped", self.settings.batcher_id)

    def step(self) -> None:
        """One iteration of the busy loop."""
        chores = self.housekeeping
        self.inbox.receive(until=min(chores.next_worker_check, self._next_plan_at))
        now = time.time()
        if now >= chores.next_worker_check:
            chores.check_workers(now)
            # A safety net under the XREAD wake-up: whatever is still unclaimed is taken now.
            self.inbox.claim_requests()
            self.inbox.recover(recovery.claim_from_others(self.redis, self.keys, self.settings.batcher_id))
        chores.tidy(now, self.inbox.inbox_id)
        self.schedule()
        self.send()

    # ----- schedule and send ---------------------------------------------------------------------
    def schedule(self) -> None:
        """Build the next step of every worker that has room for one (two with async scheduling: the
        second shortly before the first is expected to end, step_clock.py)."""
        max_in_flight = self.scheduler.config.max_steps_in_flight
        now = time.time()
        self._next_plan_at = float("inf")
        for worker_id, ws in self.scheduler.workers.items():
            while len(ws.in_flight) < max_in_flight:
                if ws.in_flight:
                    plan_at = ws.clock.plan_at(self.settings.async_plan_lead)
                    if plan_at is not None and now < plan_at:
                        self._next_plan_at = min(self._next_plan_at, plan_at)
                        break
                num_in_flight = len(ws.in_flight)
                out, failed = self.scheduler.schedule(worker_id)
                self.outbox.finished(failed)
                if out is None:
                    break
                out.epoch = self.leadership.epoch
                self._steps.append((self.keys.worker_steps(worker_id), encode(out)))
                now = time.time()
                ws.clock.on_sent(now, num_in_flight)
                self.metrics.on_step_sent(worker_id, out, now)
                self._trace(ws, out, now)
                self.outbox.stats_dirty = True

    def _trace(self, ws: WorkerState, out: SchedulerOutput, now: float) -> None:
        """One XADD per step on the pipeline `send` executes anyway: no extra round trip."""
        if self.settings.trace_maxlen:
            trace = encode_trace(step_trace(ws, out, len(self.scheduler.waiting), now))
            maxlen = self.settings.trace_maxlen
            self._pipe.xadd(self.keys.trace, {FIELD: trace}, maxlen=maxlen, approximate=True)

    def send(self) -> None:
        """Everything queued this iteration in one round trip; the steps only while we lead."""
        self.leadership.check()
        if self.outbox.stats_dirty:
            self._pipe.hset(self.keys.stats, mapping=self._stats())  # type: ignore[arg-type]
            self.outbox.stats_dirty = False
        self.metrics.publish(self._pipe, self.keys, time.time())
        steps_sent = None
        if self._steps:
            steps_sent = self.leadership.queue_steps(self._pipe, self._steps, self.outbox.min_id())
            self._steps = []
        if not len(self._pipe):
            return
        results = self._pipe.execute(raise_on_error=False)
        for result in results[:-1] if steps_sent else results:
            if isinstance(result, Exception):
                raise result
        if steps_sent is not None and not steps_sent(results[-1]):
            raise LeadershipLost(
                f"batcher {self.settings.batcher_id}: steps refused, another batcher leads now"
            )

    def _stats(self) -> dict[str, Any]:
        s = self.scheduler
        stats: dict[str, Any] = dataclasses.asdict(s.stats)
        stats.update(
            num_waiting=len(s.waiting),
            # What delays a new interactive request: batch lines (priority 1) wait behind it.
            num_waiting_interactive=s.waiting.count(0),
            num_running=s.num_running,
            num_workers=len(s.workers),
            epoch=self.leadership.epoch,
            num_recovered=self.num_recovered,
            **{f"num_steps:{wid}": ws.step_id for wid, ws in s.workers.items()},
            prefix_cache_queries=sum(ws.prefix_cache_queries for ws in s.workers.values()),
            prefix_cache_hits=sum(ws.prefix_cache_hits for ws in s.workers.values()),
            updated_at=time.time(),
        )
        return stats
