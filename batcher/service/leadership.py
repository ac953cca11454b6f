"""Leadership among batchers, held as a lease in Redis: only the leader schedules, and only its
steps reach workers.

Taking the lease (a Redis key SET with a TTL, only if absent) bumps a global epoch; the holder renews
it from its busy loop, so a wedged or paused loop loses it. Losing it is safe because every step the
batcher appends to a worker's steps stream goes through a Lua script that first checks the lease
value: an old leader that wakes from a pause after a standby took over writes nothing (the same idea
as the worker fence in gpu_worker/service/fenced_writes.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from common.protocol import FIELD
from common.redis_io.lease_scripts import RELEASE as _RELEASE
from common.redis_io.lease_scripts import RENEW as _RENEW
from common.streams import DEFAULT_CELL, cell_keys

log = logging.getLogger("batcher.leadership")

# KEYS: lease, epoch counter. ARGV: batcher id, TTL (ms), the value we held before a Redis outage
# (or ""). Returns the new epoch, or 0 when another batcher holds it.
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[3] then return 0 end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], epoch .. ':' .. ARGV[1], 'PX', ARGV[2])
return epoch
"""

# KEYS: lease, then one steps stream per step. ARGV: our lease value, field, MINID, then one step each.
_SEND_STEPS = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
for i = 2, #KEYS do
  redis.call('XADD', KEYS[i], 'MINID', '~', ARGV[3], '*', ARGV[2], ARGV[i + 2])
end
return 1
"""


class LeadershipLost(Exception):
    """This batcher no longer holds the lease: it must drop its state and stand by."""


class Leadership:
    """One batcher's claim to be the active one. `epoch` is 0 until `acquire` succeeds."""

    def __init__(self, client: redis.Redis, batcher_id: str, ttl_s: float, cell: str = DEFAULT_CELL) -> None:
        self.client = client
        self.keys = cell_keys(cell)
        self.batcher_id = batcher_id
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.epoch = 0
        self.value = ""
        # Renew well before the TTL runs out, so one slow iteration does not cost the lease.
        self._renew_every_s = ttl_s / 3
        self._renew_at = 0.0  # time.monotonic() of the next renewal
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._send_steps = client.register_script(_SEND_STEPS)

    def acquire(self, reclaim: bool = False) -> bool:
        """Take the lease if nobody holds it; a new epoch on success.

        With `reclaim` (after a Redis outage) the lease still held under our own value counts as
        free: the restarted Redis kept it, but our state is gone and we start over as a new leader,
        instead of standing by until our own lease expires.
        """
        started = time.monotonic()
        previous = self.value if reclaim else ""
        args: list[str | int] = [self.batcher_id, self.ttl_ms, previous]
        epoch = int(self._acquire(keys=[self.keys.lease, self.keys.epoch], args=args))
        if not epoch:
            return False
        self.epoch = epoch
        self.value = f"{epoch}:{self.batcher_id}"
        self._mark_renewed(started)
        return True

    def check(self) -> None:
        """Renew when due; raise LeadershipLost when it is gone. Cheap (no round trip) between renewals.

        The renewal is timed from before its round trip, so after a pause (SIGSTOP) longer than the
        TTL the clock says "due" and the first thing the loop does is find out it lost the lease.
        """
        now = time.monotonic()
        if now < self._renew_at:
            return
        if not self.value or not self._renew(keys=[self.keys.lease], args=[self.value, self.ttl_ms]):
            self.value = ""
            raise LeadershipLost(f"batcher {self.batcher_id} lost the lease of epoch {self.epoch}")
        self._mark_renewed(now)

    def release(self) -> None:
        """On a clean stop: a standby takes over at once instead of after the TTL."""
        if self.value:
            self._release(keys=[self.keys.lease], args=[self.value])
            self.value = ""

    def queue_steps(
        self, pipe: redis.client.Pipeline, steps: list[tuple[str, bytes]], min_id: str
    ) -> Callable[[Any], bool]:
        """Queue on `pipe` one fenced append of every (steps stream, encoded step). Returns the check
        to apply to the pipeline's result for it: False when the lease is no longer ours (then
        nothing was appended).

        EVALSHA directly, not a Script call on the pipeline, which would cost a SCRIPT EXISTS round
        trip on every execute; the rare NOSCRIPT (a restarted Redis) falls back to a plain call.
        """
        keys = [self.keys.lease, *(stream for stream, _ in steps)]
        args: list[Any] = [self.value, FIELD, min_id, *(step for _, step in steps)]
        # As a raw command: redis-py's cluster pipeline refuses `evalsha`, for the NOSCRIPT handled here.
        pipe.execute_command("EVALSHA", self._send_steps.sha, len(keys), *keys, *args)

        def sent(result: Any) -> bool:
            if isinstance(result, redis.exceptions.NoScriptError):
                result = self._send_steps(keys=keys, args=args)
            elif isinstance(result, Exception):
                raise result
            return bool(result)

        return sent

    def _mark_renewed(self, started: float) -> None:
        self._renew_at = started + self._renew_every_s


def current_leader(client: redis.Redis, cell: str = DEFAULT_CELL) -> str | None:
    """The cell's lease value ("<epoch>:<batcher_id>"), or None when no batcher is active there."""
    raw: Any = client.get(cell_keys(cell).lease)
    return raw.decode() if isinstance(raw, bytes) else raw
