"""Stream replies as hiredis parses them, read into tuples: no dict per entry.

An XRANGE reply is `[[id, [field, value, ...]], ...]`; an XREAD reply `{stream: entries}` (RESP3,
which redis-py 8 speaks by default) or `[[stream, entries], ...]` (RESP2), or None when a blocking read
timed out. Every cbserve entry holds one field (`m`, or an announcement's `s`), so an entry is read as
(its id, that field's value).
"""

from __future__ import annotations

from typing import Any, TypeAlias

from common.protocol import FIELD

StreamEntry: TypeAlias = tuple[str, bytes | None]  # (entry id, the value of the field asked for)


def entries(raw: list[Any], field: bytes = FIELD) -> list[StreamEntry]:
    """An XRANGE reply (or one stream's part of an XREAD reply); None for an entry without `field`."""
    return [(raw_id.decode(), _value(values, field)) for raw_id, values in raw]


def streams(reply: dict[bytes, list[Any]] | list[Any] | None) -> list[tuple[str, list[Any]]]:
    """An XREAD reply as (stream key, its raw entries) pairs; [] for a timed-out read."""
    pairs = reply.items() if isinstance(reply, dict) else reply or ()
    return [(key.decode(), raw) for key, raw in pairs]


def raw_reply(parsed: Any) -> list[Any]:
    """redis-py's parsed XREAD reply (RESP3: `{stream: [[(id, {field: value})]]}`, RESP2:
    `[[stream, [(id, {field: value})]]]`) in hiredis' shape, for clients the raw commands do not serve
    (Redis Cluster)."""
    if isinstance(parsed, dict):
        return [[_as_bytes(key), raw_entries(found[0] if found else [])] for key, found in parsed.items()]
    return [[_as_bytes(key), raw_entries(found)] for key, found in parsed or ()]


def raw_entries(parsed: Any) -> list[Any]:
    """redis-py's parsed XRANGE reply (`[(id, {field: value})]`) in hiredis' shape."""
    return [[_as_bytes(i), [x for kv in fields.items() for x in kv]] for i, fields in parsed or ()]


def _value(values: list[bytes], field: bytes) -> bytes | None:
    if len(values) == 2 and values[0] == field:  # the one field every cbserve entry holds
        return values[1]
    for i in range(0, len(values) - 1, 2):
        if values[i] == field:
            return values[i + 1]
    return None


def _as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
