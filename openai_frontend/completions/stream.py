"""A chat or completions answer streamed: opening chunks, one chunk per delta, usage, then `[DONE]`.

Takes the n requests of an n-choice response (see `request_builder.fan_out`); with one choice, each
chunk's SSE id is its token stream entry id, so a client can resume. With several, the chunks of
different token streams interleave and no id could name a resume point: they carry none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from common.redis_io.redis_conn import entry_key
from openai_frontend.completions.endpoint import Chunks, usage
from openai_frontend.follow.request_follower import Output
from openai_frontend.follow.stream_out import Encoder, StreamEvent
from openai_frontend.follow.token_stream import RequestFailed
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.protocol.errors import OpenAIError, from_request_error

DONE = StreamEvent("[DONE]")
# Before every token event: a resumed stream sent its opening chunks the first time.
_OPENING = entry_key("0-0")


class ChunkStream(Encoder):
    def __init__(self, chunks: Chunks, requests: Sequence[PreparedRequest]) -> None:
        self._chunks = chunks
        self._requests = requests
        self._num_output_tokens = [0] * len(requests)
        self._num_cached_tokens = [0] * len(requests)

    def opening(self) -> list[StreamEvent]:
        return [StreamEvent(data, position=_OPENING) for data in self._chunks.opening()]

    def delta(self, index: int, out: Output) -> list[StreamEvent]:
        self._num_output_tokens[index] = out.num_output_tokens
        self._num_cached_tokens[index] = out.num_cached_tokens
        chunk = self._chunks.delta(index, out)
        if chunk is None:
            return []
        event_id = out.entry_id if len(self._requests) == 1 else None
        return [StreamEvent(chunk, id=event_id, position=entry_key(out.entry_id))]

    async def closing(self) -> list[StreamEvent]:
        if not self._requests[0].include_usage:
            return []
        num_used = usage(self._requests, self._num_output_tokens, self._num_cached_tokens)
        return [StreamEvent(self._chunks.usage(num_used))]

    async def failed(self, exc: RequestFailed) -> list[StreamEvent]:
        data = json.dumps(from_request_error(exc.error).body())
        position = None if exc.entry_id is None else entry_key(exc.entry_id)
        return [StreamEvent(data, id=exc.entry_id, position=position)]

    def error(self, error: OpenAIError) -> list[StreamEvent]:
        return [StreamEvent(json.dumps(error.body()))]

    def end(self) -> list[StreamEvent]:
        return [DONE]
