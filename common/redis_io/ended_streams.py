"""Which token streams ended: one stream of announcements per cell (`CellKeys.ended_streams`).

A request's last token-stream event (a finish, a pooling result, a RequestError) is written together
with an entry here naming its stream, in the same write: the worker's fenced publish (one script,
gpu_worker/service/fenced_writes.py), the batcher's error or abort (one pipeline). A gateway follows a
non-streaming request by this stream alone and reads its token stream whole once it ended (vLLM's
`RequestOutputKind.FINAL_ONLY`), instead of being handed its tokens at every step
(openai_frontend/follow/ended_reads.py).

An announcement is only a wake-up: a reader that may have missed some (a failed read, a position
older than their retention) reads the streams it follows whole instead, so they are kept briefly.
"""

from __future__ import annotations

from typing import Any, Final

from common.redis_io.redis_conn import min_id
from common.streams import cell_keys, cell_of, token_stream

# The one field of an announcement: the key of the token stream that ended.
ENDED_FIELD: Final = b"s"
# How long announcements are kept (trimmed with MINID as they are appended, and by the batcher).
ENDED_RETENTION_S: Final = 60


def ended_min_id(now: float | None = None) -> str:
    """The MINID an announcement's append trims to."""
    return min_id(ENDED_RETENTION_S, now)


def announce_end(pipe: Any, req_id: str) -> None:
    """Queue on `pipe` (sync or async) the announcement that `req_id`'s token stream has its last event;
    queue it in the same pipeline as that event, after it."""
    ended = cell_keys(cell_of(req_id)).ended_streams
    pipe.xadd(ended, {ENDED_FIELD: token_stream(req_id)}, minid=ended_min_id(), approximate=True)
