"""A worker writes only while it is registered: its entry in its cell's workers hash is its lease.

The batcher fences a worker it declares dead by deleting that entry. Every write that matters (token
events + step result, heartbeat) is a Lua script that first checks the entry, so it runs whole or not
at all: a worker that was only paused (SIGSTOP, a long GC, a network partition) cannot append a
stale token after the batcher moved its requests, and cannot look alive again under the old id.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis
from redis.exceptions import NoScriptError

from common.protocol import FIELD
from common.redis_io.command_packer import Arg, pack
from common.redis_io.ended_streams import ENDED_FIELD, ended_min_id
from common.redis_io.raw_command import execute, raw_capable
from common.streams import CellKeys

# KEYS: workers hash, inbox, steps stream, ended-streams stream, then the n token streams.
# ARGV: worker id, field, result, inbox MINID, steps MINID, token TTL, n, ended MINID, ended field, then
# per token stream: event, "1" if last. A last event is announced on the ended-streams stream
# (common/redis_io/ended_streams.py) in the same script: a gateway that waits for the end sees both or
# neither.
_PUBLISH = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local n = tonumber(ARGV[7])
for i = 1, n do
  local j = 10 + (i - 1) * 2
  local stream = KEYS[4 + i]
  redis.call('XADD', stream, '*', ARGV[2], ARGV[j])
  if ARGV[j + 1] == '1' then
    redis.call('EXPIRE', stream, ARGV[6])
    redis.call('XADD', KEYS[4], 'MINID', '~', ARGV[8], '*', ARGV[9], stream)
  end
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
class TokenWrites:
    """A step's token events, flat, in the publish script's order (no object per token)."""

    streams: list[str] = field(default_factory=list)  # per event, its request's token stream
    # Per event: the encoded TokenEvent, PromptEvent or PoolingEvent, then b"1" if it is the request's
    # last (the stream starts its resume-window TTL and is announced as ended), else b"0".
    args: list[bytes] = field(default_factory=list)

    def add(self, stream: str, event: bytes, last: bool) -> None:
        self.streams.append(stream)
        self.args += (event, b"1" if last else b"0")


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
        tokens: TokenWrites,
        result: bytes,
        *,
        inbox_min_id: str,
        steps_min_id: str,
        token_ttl_s: int,
    ) -> bool:
        """Append the token events (each to its token stream) and the step result atomically; False
        when this worker is fenced."""
        k = self._keys
        keys = [k.workers, k.inbox, steps_stream, k.ended_streams, *tokens.streams]
        num_tokens = len(tokens.streams)
        args: list[Arg] = [worker_id, FIELD, result, inbox_min_id, steps_min_id, token_ttl_s, num_tokens]
        args += [ended_min_id(), ENDED_FIELD, *tokens.args]
        if not raw_capable(client):
            return bool(self._publish(keys=keys, args=args, client=client))
        # Packed at once (three arguments per token), not through redis-py's encoder.
        command = pack("EVALSHA", self._publish.sha, len(keys), *keys, *args)
        try:
            return bool(execute(client, command)[0])
        except NoScriptError:  # a restarted or flushed Redis: load it again, as redis-py's Script does
            client.script_load(_PUBLISH)
            return bool(execute(client, command)[0])

    def beat(self, client: redis.Redis, worker_id: str) -> bool:
        """Record a heartbeat; False when this worker is fenced (it must not look alive again)."""
        now_ms = int(time.time() * 1000)
        keys = [self._keys.workers, self._keys.heartbeat]
        return bool(self._beat(keys=keys, args=[worker_id, now_ms], client=client))
