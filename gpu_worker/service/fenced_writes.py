"""A worker writes only while it is registered: its entry in its cell's workers hash is its lease.

The batcher fences a worker it declares dead by deleting that entry. Every write that matters (token
events + step result, heartbeat) is a Lua script that first checks the entry, so it runs whole or not
at all: a worker that was only paused (SIGSTOP, a long GC, a network partition) cannot append a
stale token after the batcher moved its requests, and cannot look alive again under the old id.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from common.protocol import FIELD
from common.streams import CellKeys

# KEYS: workers hash, inbox, steps stream, then the n token streams.
# ARGV: worker id, field, result, inbox MINID, steps MINID, token TTL, n, then per token stream:
# event, "1" if last.
_PUBLISH = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local n = tonumber(ARGV[7])
for i = 1, n do
  local j = 8 + (i - 1) * 2
  redis.call('XADD', KEYS[3 + i], '*', ARGV[2], ARGV[j])
  if ARGV[j + 1] == '1' then redis.call('EXPIRE', KEYS[3 + i], ARGV[6]) end
end
redis.call('XADD', KEYS[2], 'MINID', '~', ARGV[4], '*', ARGV[2], ARGV[3])
redis.call('XTRIM', KEYS[3], 'MINID', '~', ARGV[5])
return 1
"""

# KEYS: workers hash, heartbeat zset. ARGV: worker id, now (unix ms).
_BEAT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
"""


@dataclass(slots=True)
class TokenWrite:
    stream: str  # the request's token stream
    event: bytes  # encoded TokenEvent, PromptEvent or PoolingEvent
    last: bool  # the request finished: the stream starts its resume-window TTL


class FencedWrites:
    """The fenced writes of one worker id, as scripts loaded once per Redis (EVALSHA after that)."""

    def __init__(self, client: redis.Redis, keys: CellKeys) -> None:
        # Every key of a script is in the cell's slot: the token streams are of requests placed there.
        self._keys = keys
        self._publish = client.register_script(_PUBLISH)
        self._beat = client.register_script(_BEAT)

    def publish(
        self,
        client: redis.Redis,
        worker_id: str,
        steps_stream: str,
        tokens: list[TokenWrite],
        result: bytes,
        *,
        inbox_min_id: str,
        steps_min_id: str,
        token_ttl_s: int,
    ) -> bool:
        """Append the token events (each to its token stream) and the step result atomically; False
        when this worker is fenced."""
        keys = [self._keys.workers, self._keys.inbox, steps_stream, *(t.stream for t in tokens)]
        args: list[Any] = [worker_id, FIELD, result, inbox_min_id, steps_min_id, token_ttl_s, len(tokens)]
        for t in tokens:
            args += [t.event, "1" if t.last else "0"]
        return bool(self._publish(keys=keys, args=args, client=client))

    def beat(self, client: redis.Redis, worker_id: str) -> bool:
        """Record a heartbeat; False when this worker is fenced (it must not look alive again)."""
        now_ms = int(time.time() * 1000)
        keys = [self._keys.workers, self._keys.heartbeat]
        return bool(self._beat(keys=keys, args=[worker_id, now_ms], client=client))
