"""The active batcher's periodic chores: worker heartbeats (join, fence, remove), stream trims,
follow-deadline reaping and queue deadlines. Each runs on its own clock from the busy loop."""

from __future__ import annotations

import logging
import time
from typing import Any

from batcher.service.context import BatcherContext, ContextPart
from batcher.service.follow_deadlines import FollowDeadlineReaper
from batcher.service.retention import StreamTrimmer
from common import streams
from common.protocol import FIELD, WorkerInfo, WorkerLost, decode_worker, encode
from common.redis_io.redis_conn import as_str

log = logging.getLogger("batcher")


class Housekeeping(ContextPart):
    def __init__(self, ctx: BatcherContext) -> None:
        super().__init__(ctx)
        self.next_worker_check = 0.0
        self._trimmer = StreamTrimmer(ctx.settings.retention_s)
        self._reaper = FollowDeadlineReaper()

    def settle(self, now: float) -> None:
        """Leadership gained at `now`: follow deadlines get time to be renewed (follow_deadlines.py)."""
        self._reaper.settle(now)

    def resume(self, now: float) -> None:
        """Redis takes writes again after refusing them: workers and gateways could write no heartbeat
        or follow deadline meanwhile, so neither is judged before they had time to write again."""
        self.next_worker_check = max(self.next_worker_check, now + self.settings.heartbeat_timeout_s)
        self._reaper.settle(now)

    def tidy(self, now: float, inbox_read_id: str) -> None:
        """The chores that are due, after this iteration's claims (claimed entries are pending now)."""
        if self._trimmer.due(now):
            self._trimmer.trim(self.redis, self.keys, inbox_read_id, now)
        if self._reaper.due(now):
            self._abort_unfollowed(now)
        self.outbox.finished(self.scheduler.expire_waiting(now))

    def _abort_unfollowed(self, now: float) -> None:
        """Abort the requests whose follow deadline passed: their clients left and nobody resumed."""
        self.leadership.check()  # popping follow deadlines is a write: only the leader's
        for req_id in self._reaper.pop_expired(self.redis, self.keys, now):
            if req_id in self.scheduler.requests:
                # The line keeps its first words: operators and tests match it.
                log.info("no client follows it (deadline passed): aborting", extra={"request_id": req_id})
                req = self.scheduler.abort_request(req_id, "abort", time.time())
                if req is not None:
                    self.outbox.finished([req])

    # ----- workers -------------------------------------------------------------------------------
    def check_workers(self, now: float) -> None:
        """Join workers with a fresh heartbeat; drop those whose heartbeat is too old."""
        self.next_worker_check = now + self.settings.worker_check_interval_s
        self.outbox.stats_dirty = True  # refreshes `updated_at`, the batcher's own liveness signal
        # The cell's entry in the cluster-wide registry (gateways with GATEWAY_CELLS=*): here, every
        # worker check, not with each step's stats, whose pipeline would then reach a second shard.
        self.redis.zadd(streams.CELLS_REGISTRY, {self.settings.cell: now})
        beats: Any = self.redis.zrange(self.keys.heartbeat, 0, -1, withscores=True)
        cutoff_ms = (now - self.settings.heartbeat_timeout_s) * 1000
        alive = {as_str(wid) for wid, score in beats if score >= cutoff_ms}
        for worker_id, ws in list(self.scheduler.workers.items()):
            if worker_id not in alive and not ws.fenced:
                self._fence_worker(worker_id)
        for worker_id in alive - self.scheduler.workers.keys():
            raw: Any = self.redis.hget(self.keys.workers, worker_id)
            if raw is not None:
                self.add_worker(decode_worker(raw))

    def add_worker(self, info: WorkerInfo) -> None:
        known = self.scheduler.workers.get(info.worker_id)
        if known is not None and known.info.started_at == info.started_at:
            return
        orphans = self.scheduler.add_worker(info)
        if known is not None:
            log.warning(
                "worker %s restarted under the same id; %d requests will be recomputed",
                info.worker_id,
                len(orphans),
            )
        self.outbox.stats_dirty = True
        log.info(
            "worker %s joined: %d blocks of %d tokens, max_model_len %d",
            info.worker_id,
            info.num_blocks,
            info.block_size,
            info.max_model_len,
        )

    def _fence_worker(self, worker_id: str) -> None:
        """Declare a worker dead: revoke its registration, which every write of the worker checks
        atomically (gpu_worker/service/fenced_writes.py), then post a WorkerLost marker behind its
        last results."""
        self.scheduler.fence_worker(worker_id)
        pipe = self.outbox.pipe
        pipe.hdel(self.keys.workers, worker_id)
        pipe.zrem(self.keys.heartbeat, worker_id)
        pipe.delete(self.keys.worker_steps(worker_id))
        marker = WorkerLost(worker_id=worker_id, reason="no heartbeat or deregistered")
        pipe.xadd(self.keys.inbox, {FIELD: encode(marker)}, minid=self.outbox.min_id(), approximate=True)
        self.outbox.stats_dirty = True
        log.warning("worker %s missed its heartbeat: fenced", worker_id)

    def remove_worker(self, worker_id: str, reason: str) -> None:
        """Its WorkerLost marker was read: every result it wrote is in; its requests move elsewhere."""
        orphans = self.scheduler.remove_worker(worker_id)
        self.outbox.pipe.hdel(self.keys.stats, f"num_steps:{worker_id}")
        self.outbox.stats_dirty = True
        log.warning(
            "worker %s is gone (%s); %d requests will be recomputed elsewhere",
            worker_id,
            reason,
            len(orphans),
        )
