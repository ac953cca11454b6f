"""What the batcher writes about finished requests, queued on the pipeline it executes once per
iteration: the client's last event, key expiry, the acknowledgement, and the dead-letter copy."""

from __future__ import annotations

import logging

import redis

from batcher.core.request import Request
from common import streams
from common.protocol import FIELD, RequestError, encode
from common.redis_io.ended_streams import announce_end
from common.redis_io.redis_conn import min_id

log = logging.getLogger("batcher")

ABORTED = "the request was aborted by the gateway (its client left without resuming, or it timed out)"


class Outbox:
    def __init__(self, pipe: redis.client.Pipeline, retention_s: int, keys: streams.CellKeys) -> None:
        self.pipe = pipe
        self.keys = keys
        self.retention_s = retention_s
        self.stats_dirty = True  # the stats hash needs publishing with the next execute

    def min_id(self) -> str:
        """The oldest entry id a trimmed append keeps: the retention window."""
        return min_id(self.retention_s)

    def finished(self, finished: list[Request]) -> None:
        for req in finished:
            log.debug("request finished (%s)", req.finish_reason, extra={"request_id": req.req_id})
            if req.finish_reason == "error":
                message = req.error or "request failed"
                self._last_event(req, RequestError(req_id=req.req_id, message=message, code=req.error_code))
            elif req.finish_reason == "abort":
                # Its client left and nobody resumed it: a late reader (resume, fetch) learns so at once.
                aborted = RequestError(req_id=req.req_id, message=ABORTED, code="request_aborted")
                self._last_event(req, aborted)
            self.expire_request_keys(req.req_id)
            if req.dead_letter:
                fields = {FIELD: encode(req.to_message())}
                self.dead_letter(fields, req.entry_id, req.error or "", req.num_failed_deliveries)
            self.pipe.xack(self.keys.requests, streams.BATCHER_GROUP, req.entry_id)
            self.stats_dirty = True

    def _last_event(self, req: Request, event: RequestError) -> None:
        """To its token stream (expire_request_keys gives it the resume window), announced as its end."""
        self.pipe.xadd(streams.token_stream(req.req_id), {FIELD: encode(event)})
        announce_end(self.pipe, req.req_id)

    def expire_request_keys(self, req_id: str) -> None:
        """The request is over: its token stream (the worker sets its TTL with a last token; an aborted
        or failed one has none), the gateway's metadata (whose TTL covered the request timeout) and a
        submit_once marker (24 h) all stay only for the resume window, whoever followed the request."""
        for key in streams.request_keys(req_id):
            self.pipe.expire(key, self.retention_s)

    def dead_letter(self, fields: dict[bytes, bytes], entry_id: str, error: str, deliveries: int) -> None:
        """Keep a given-up request for operators: its original fields plus why and how often it failed."""
        entry: dict[bytes, bytes | str | int] = {
            **fields,
            b"entry_id": entry_id,
            b"error": error,
            b"deliveries": deliveries,
        }
        self.pipe.xadd(self.keys.dead_letter, entry, minid=self.min_id(), approximate=True)  # type: ignore[arg-type]
