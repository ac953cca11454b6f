"""The active batcher's side of follow deadlines (openai_frontend/follow/deadlines.py): abort the unfollowed.

About once a second, one script pops every request whose deadline in `llm:{cell}:follow:deadlines` has passed;
those the scheduler still holds (waiting or running) are aborted like a client's abort. A new leader
waits `SETTLE_S` before its first look: after a takeover or a Redis outage the gateways need a
moment to renew their deadlines, and a request must not die because the batcher came back first.
"""

from __future__ import annotations

from typing import Any

import redis

from common.streams import CellKeys

CHECK_INTERVAL_S = 1.0
SETTLE_S = 5.0
_POP_LIMIT = 1000

# Atomic, so a deadline renewed between the read and the removal is not lost: it is either popped
# (expired at the time of the script) or left alone.
_POP_EXPIRED = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #expired > 0 then redis.call('ZREM', KEYS[1], unpack(expired)) end
return expired
"""


class FollowDeadlineReaper:
    def __init__(self) -> None:
        self._next_at = 0.0

    def settle(self, now: float) -> None:
        """Leadership (re)gained at `now`: give gateways time to renew before expiring anything."""
        self._next_at = now + SETTLE_S

    def due(self, now: float) -> bool:
        return now >= self._next_at

    def pop_expired(self, client: redis.Redis, keys: CellKeys, now: float) -> list[str]:
        self._next_at = now + CHECK_INTERVAL_S
        raw: Any = client.eval(_POP_EXPIRED, 1, keys.follow_deadlines, repr(now), _POP_LIMIT)
        return [m.decode() if isinstance(m, bytes) else str(m) for m in raw]
