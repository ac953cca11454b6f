"""Delivery streams: a gateway reads the events of its requests from one stream per cell.

Each request's token stream (`llm:{cell}:tokens:{req_id}`) stays the source of truth: resume, replay
and every other reader use it. A request submitted with `deliver_to` (a gateway's id) has each of its
events also copied, in the same script that appends them, into that gateway's delivery stream
`llm:{cell}:deliver:{gateway_id}`: one entry per write (a worker step) holding every event of that
gateway's requests, each with its request id and the entry id it got in its own token stream (the SSE
id). So a gateway with thousands of requests in flight blocks on one key per cell, not one per request.

An entry is one field `m`: the msgpack array `[prev_id, [[req_id, entry_id, event], ...]]`, built in
Lua (`event` is the token stream entry's `m`, as bin). `prev_id` is the delivery stream's previous
entry id ("0-0" for its first): a reader whose cursor is not `prev_id` missed entries (trimmed under
it, lost in a Redis restart) and reads its requests' own token streams again. The stream is capped
(`MAXLEN ~`) and expires `ttl` after its last write, so a dead gateway's stream goes away.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from common.protocol import FIELD

# Entries kept per delivery stream: one per worker step with events for that gateway, so several
# seconds of steps of every worker of the cell; a reader that falls further behind reads again.
DELIVERY_MAXLEN: Final = 4096

# Lua helpers shared by the worker's fenced publish (gpu_worker/fence.py) and APPEND_EVENT below.
# deliver(key, items, maxlen, ttl): items is a flat list req_id, entry_id, event, req_id, ...
DELIVER_LUA: Final = """
local function mp_len(n, fix, fixmax, c8, c16)
  if n <= fixmax then return string.char(fix + n) end
  if c8 ~= nil and n < 256 then return string.char(c8, n) end
  if n < 65536 then return string.char(c16, math.floor(n / 256), n % 256) end
  return string.char(c16 + 1, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256)
end
local function mp_str(s) return mp_len(#s, 0xa0, 31, 0xd9, 0xda) .. s end
local function mp_bin(s) return mp_len(#s, 0, -1, 0xc4, 0xc5) .. s end
local function mp_array(n) return mp_len(n, 0x90, 15, nil, 0xdc) end
local function deliver(key, items, maxlen, ttl)
  local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  local prev = '0-0'
  if #last > 0 then prev = last[1][1] end
  local parts = {mp_array(2), mp_str(prev), mp_array(#items / 3)}
  for i = 1, #items, 3 do
    parts[#parts + 1] = mp_array(3) .. mp_str(items[i]) .. mp_str(items[i + 1]) .. mp_bin(items[i + 2])
  end
  redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'm', table.concat(parts))
  redis.call('EXPIRE', key, ttl)
end
"""

# One event appended to its token stream and, with a second key, to a delivery stream; returns the
# token stream entry id. For writers other than the worker (the batcher's errors, test harnesses).
# KEYS: token stream[, delivery stream]. ARGV: field, event, req_id, delivery MAXLEN, TTL.
APPEND_EVENT: Final = (
    DELIVER_LUA
    + """
local id = redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[2])
if #KEYS > 1 then deliver(KEYS[2], {ARGV[3], id, ARGV[2]}, ARGV[4], ARGV[5]) end
return id
"""
)


class Delivery(msgspec.Struct, array_like=True):
    """One delivery stream entry: the previous entry's id and the events, oldest first."""

    prev_id: str
    events: list[tuple[str, str, bytes]]  # (req_id, token stream entry id, the entry's `m`)


_decoder = msgspec.msgpack.Decoder(Delivery)


def decode_delivery(fields: dict[bytes, bytes]) -> Delivery:
    return _decoder.decode(fields[FIELD])


def append_event_args(
    token_stream: str, delivery_stream: str | None, req_id: str, event: bytes, ttl_s: int
) -> tuple[Any, ...]:
    """EVAL arguments of APPEND_EVENT (EVAL, not EVALSHA: these writers are rare, one per request)."""
    keys = (token_stream,) if delivery_stream is None else (token_stream, delivery_stream)
    return (APPEND_EVENT, len(keys), *keys, FIELD, event, req_id, DELIVERY_MAXLEN, ttl_s)
