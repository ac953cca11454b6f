"""The batcher's busy loop: receive (requests, results, aborts), schedule, send (one step per worker).

Reading is inbox.py, the writes about finished requests outbox.py, the periodic chores (heartbeats,
trims, follow deadlines, queue deadlines) housekeeping.py, what a new leader reads back recovery.py,
and every scheduling decision batcher/core/scheduler.py.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from batcher.core.scheduler import Scheduler, SchedulerConfig
from batcher.core.worker_state import WorkerState
from batcher.service import pending_writes, recovery
from batcher.service.context import BatcherContext
from batcher.service.housekeeping import Housekeeping
from batcher.service.inbox import Inbox
from batcher.service.leadership import Leadership, LeadershipLost
from batcher.service.metrics import BatcherMetrics
from batcher.service.outbox import Outbox
from batcher.service.step_trace import step_trace
from batcher.settings import BatcherSettings
from common import streams
from common.metrics_schema import ACCEPTED_PER_POS
from common.protocol import FIELD, SchedulerOutput, encode
from common.redis_io.redis_refusal import RedisRefusesWrites, refuses_writes
from common.redis_io.retry import Backoff
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
        self.leadership = leadership  # held: the active batcher (leader.py); LeadershipLost ends run()
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=settings.max_num_seqs,
                max_num_batched_tokens=settings.max_num_batched_tokens,
                max_num_encoder_input_tokens=settings.max_num_encoder_input_tokens,
                scheduling_policy=settings.scheduling_policy,
                waiting_served_ratio=settings.waiting_served_ratio,
                max_waiting_tokens=settings.max_waiting_tokens,
                async_scheduling=settings.async_scheduling,
                max_deliveries=settings.max_deliveries,
                enable_prefix_caching=settings.enable_prefix_caching,
                cache_overlap_weight=settings.cache_overlap_weight,
                prefix_wait=settings.prefix_wait,
                waiting_order=settings.waiting_order,
                speculative=settings.speculative_config,
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
        # Gateways bound their queue by these stats: a Redis restarted from its AOF may hold an old copy.
        self.outbox.stats_dirty = True
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
            try:
                self.step()
            except RedisRefusesWrites as e:
                self._ride_out(e.cause, stop)
            except redis.ResponseError as e:  # a chore's own write (the cells registry)
                if not refuses_writes(e):
                    raise
                self._ride_out(e, stop)
        log.info("batcher %s stopped", self.settings.batcher_id)

    def step(self) -> None:
        """One iteration of the busy loop."""
        chores = self.housekeeping
        plans = self._next_plan_at < chores.next_worker_check
        self.inbox.receive(min(chores.next_worker_check, self._next_plan_at), precise=plans)
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
        self._flush()

    def _flush(self) -> None:
        """Execute the pipeline, the steps last (fenced). The writes Redis refuses stay queued, in
        order (the commands on the pipeline, the steps in `_steps`); then RedisRefusesWrites."""
        steps, self._steps = self._steps, []
        steps_sent = self.leadership.queue_steps(self._pipe, steps, self.outbox.min_id()) if steps else None
        if not len(self._pipe):
            return
        commands = pending_writes.queued(self._pipe)
        results = self._pipe.execute(raise_on_error=False)
        if steps_sent is not None:
            commands, results, steps_result = commands[:-1], results[:-1], results[-1]
        refused = [(c, r) for c, r in zip(commands, results, strict=True) if isinstance(r, Exception)]
        for _, result in refused:
            if not refuses_writes(result):
                raise result
        pending_writes.requeue(self._pipe, [c for c, _ in refused])
        refusal = refused[0][1] if refused else None
        if steps_sent is not None:
            try:
                taken = steps_sent(steps_result)
            except redis.ResponseError as e:
                if not refuses_writes(e):
                    raise
                self._steps = steps + self._steps  # the script wrote nothing: sent again later
                refusal = refusal or e
            else:
                if not taken:
                    raise LeadershipLost(
                        f"batcher {self.settings.batcher_id}: steps refused, another batcher leads now"
                    )
        if refusal is not None:
            raise RedisRefusesWrites(refusal)

    def _ride_out(self, refusal: BaseException, stop: threading.Event) -> None:
        """Redis refuses writes (full, read-only): keep the lease, the state and the refused writes,
        and retry them with backoff until Redis takes them. Nothing new is read or scheduled
        meanwhile, so what waits to be written does not grow. LeadershipLost if the lease is gone."""
        log.warning("redis refuses writes (%s): keeping leadership and state, retrying", refusal)
        backoff = Backoff(max_s=self.settings.lease_ttl_s / 5)  # the lease is renewed in time
        while not stop.wait(backoff.next_delay()):
            if not len(self._pipe):  # a chore's write was refused: a write that shows when Redis takes one
                self._pipe.hset(self.keys.stats, "updated_at", time.time())
            try:
                self.leadership.check()
                self._flush()
            except RedisRefusesWrites:
                continue
            except redis.ResponseError as e:  # the lease renewal, refused by a read-only Redis
                if not refuses_writes(e):
                    raise
                continue
            log.info("redis takes writes again after %d retries: serving", backoff.num_failures)
            self.housekeeping.resume(time.time())
            return

    def _stats(self) -> dict[str, Any]:
        s = self.scheduler
        stats: dict[str, Any] = s.stats.as_dict()
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
            **{f"{ACCEPTED_PER_POS}:{pos}": n for pos, n in enumerate(s.spec_accepted_per_pos)},
            spec_decode_num_workers_off=sum(bool(w.auto_off and w.auto_off.off) for w in s.workers.values()),
            updated_at=time.time(),
        )
        return stats
