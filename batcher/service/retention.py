"""The active batcher's trim of the shared streams, about once a second.

Writers trim as they append (`XADD ... MINID ~`), but only when they append: an idle system would
keep its last window of entries for ever. And an age bound alone cuts entries of the requests
stream that are still pending (a request running longer than the window, which the default
request timeout allows), so that a batcher taking over could not rebuild them. So the requests
stream is appended to without trimming, and trimmed here:

- `llm:requests`: entries older than the retention window, never from the oldest pending entry on
  (a long request keeps the entries after it until it ends: bounded by the request timeout);
- `llm:batcher:inbox`: older than the window, never past what this batcher has read;
- `llm:requests:dead`: older than the window;
- `llm:ended-streams`: older than its own short window (common/redis_io/ended_streams.py).

Exact trims (no `~`), so an idle Redis ends with empty streams, not up to a node's worth of entries.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from common import streams
from common.redis_io.ended_streams import ended_min_id
from common.redis_io.redis_conn import as_str, entry_key

# How often the active batcher trims.
TRIM_INTERVAL_S = 1.0


class StreamTrimmer:
    def __init__(self, retention_s: int) -> None:
        self.retention_s = retention_s
        self._next_at = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next_at

    def trim(
        self, client: redis.Redis, keys: streams.CellKeys, inbox_read_id: str, now: float | None = None
    ) -> None:
        """Two round trips: where the oldest pending request is, then the four trims."""
        now = time.time() if now is None else now
        self._next_at = now + TRIM_INTERVAL_S
        cutoff = (max(int((now - self.retention_s) * 1000), 0), 0)
        summary: Any = client.xpending(keys.requests, streams.BATCHER_GROUP)
        requests_floor = cutoff
        if summary["pending"]:
            requests_floor = min(cutoff, entry_key(as_str(summary["min"])))
        read_ms, read_seq = entry_key(inbox_read_id)
        inbox_floor = min(cutoff, (read_ms, read_seq + 1))  # everything read may go
        pipe = client.pipeline(transaction=False)
        pipe.xtrim(keys.requests, minid=_id(requests_floor), approximate=False)
        pipe.xtrim(keys.inbox, minid=_id(inbox_floor), approximate=False)
        pipe.xtrim(keys.dead_letter, minid=_id(cutoff), approximate=False)
        pipe.xtrim(keys.ended_streams, minid=ended_min_id(now), approximate=False)
        pipe.execute()


def _id(key: tuple[int, int]) -> str:
    return f"{key[0]}-{key[1]}"
