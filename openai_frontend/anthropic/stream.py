"""A message streamed as Anthropic's events (events.py), through the one stream-out (follow/stream_out.py)."""

from __future__ import annotations

from openai_frontend.anthropic.events import MessageEvents, error_event, event
from openai_frontend.anthropic.message import stop_sequence
from openai_frontend.follow.collect import Completed
from openai_frontend.follow.request_follower import Output
from openai_frontend.follow.stream_out import Encoder, StreamEvent
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.protocol.errors import OpenAIError


class MessageStream(Encoder):
    # While nothing is sent (queued, a slow step), a `ping`, as Anthropic keeps its own streams alive.
    keepalive = event("ping")

    def __init__(self, request: PreparedRequest, tokenizer: ModelTokenizer) -> None:
        self._request = request
        self._tokenizer = tokenizer
        self._events = MessageEvents(request)
        self._done = Completed()

    def opening(self) -> list[StreamEvent]:
        return self._events.opening()

    def delta(self, index: int, out: Output) -> list[StreamEvent]:
        self._done.add(out)
        return self._events.delta(out.text)

    async def closing(self) -> list[StreamEvent]:
        done = self._done
        matched = stop_sequence(self._request, done, self._tokenizer)
        return self._events.closing(done.finish_reason, matched, done.num_output_tokens)

    def error(self, error: OpenAIError) -> list[StreamEvent]:
        return [error_event(error)]
