"""When a request is retried, dead-lettered, expired or aborted before it arrived. No I/O.

- A request that fails alone on a worker (the worker dropped it) is queued again as a new attempt;
  on its `max_deliveries`-th failure it fails for good and is dead-lettered.
- A request never scheduled by its queue deadline fails with `queue_timeout`; one that already ran
  (preempted, orphaned) keeps its place: failing it would waste its work and break its stream.
- An abort can reach the batcher before the request it cancels: it is remembered for a while.
"""

from __future__ import annotations

from batcher.core.request import Request
from batcher.core.scheduler_state import SchedulerState, mark_finished
from batcher.core.worker_state import WorkerState

# An abort can reach the batcher before the request it cancels; remember it this long (seconds).
EARLY_ABORT_TTL_S = 300.0


def retry_or_give_up(state: SchedulerState, ws: WorkerState, req: Request, message: str) -> bool:
    """Queue a request that failed alone again, or give it up on its `max_deliveries`-th failure.
    True when it finished."""
    req.num_failed_deliveries += 1
    ws.kv_cache_manager.uncache_unshared(req)
    if req.num_failed_deliveries >= state.config.max_deliveries:
        state.fail(req, f"{message} (failed on {req.num_failed_deliveries} deliveries)")
        req.dead_letter = True
        state.stats.num_dead_lettered += 1
        return True
    state.evict(ws, req)  # already gone on the worker; freeing twice is harmless there
    state.stats.num_retries += 1
    return False


def expire_waiting(state: SchedulerState, now: float) -> list[Request]:
    """Fail the requests still waiting for their first step past their queue deadline."""
    expired = [
        req
        for req in state.waiting
        if req.queue_deadline is not None and now > req.queue_deadline and req.attempt == 0
    ]
    for req in expired:
        waited = now - req.arrival_time
        state.fail(req, f"the request waited {waited:.0f} s in the queue without being scheduled")
        req.error_code = "queue_timeout"
        state.stats.num_queue_timeouts += 1
    return expired


class EarlyAborts:
    """Aborts whose request has not arrived yet: applied when it does, forgotten after a TTL."""

    def __init__(self) -> None:
        self._aborts: dict[str, tuple[float, str]] = {}  # req_id -> (when, reason)

    def remember(self, req_id: str, reason: str, now: float) -> None:
        self._aborts[req_id] = (now, reason)

    def expire(self, now: float) -> None:
        stale = [rid for rid, (t, _) in self._aborts.items() if now - t > EARLY_ABORT_TTL_S]
        for rid in stale:
            del self._aborts[rid]

    def apply(self, req: Request) -> bool:
        """Finish `req` now if an abort for it came first; True when it did."""
        early = self._aborts.pop(req.req_id, None)
        if early is None:
            return False
        mark_finished(req, "stop" if early[1] == "stop" else "abort")
        return True
