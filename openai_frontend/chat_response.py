"""The answers of /v1/chat/completions: the role first, content deltas, optional usage; or one body."""

from __future__ import annotations

from openai_frontend.collect import Completed
from openai_frontend.logprobs import LogprobsFormatter
from openai_frontend.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
)
from openai_frontend.request_builder import PreparedRequest
from openai_frontend.request_runner import Output
from openai_frontend.response_format import Chunks, Endpoint


class ChatChunks(Chunks):
    chunk_type = ChatCompletionChunk

    def opening(self) -> list[str]:
        return [
            self._chunk([ChatChunkChoice(index=i, delta={"role": "assistant", "content": ""})])
            for i in range(self.request.n)
        ]

    def delta(self, index: int, out: Output) -> str:
        delta = {"content": out.text} if out.text else {}
        logprobs = self.logprobs.chat(out.events) if self.request.logprobs else None
        return self._delta_chunk(ChatChunkChoice, index, out, delta=delta, logprobs=logprobs)


def _choice(
    index: int, done: Completed, request: PreparedRequest, formatter: LogprobsFormatter
) -> ChatChoice:
    return ChatChoice(
        index=index,
        message=AssistantMessage(content=done.text),
        logprobs=formatter.chat(done.events) if request.logprobs else None,
        finish_reason=done.finish_reason,
        token_ids=done.token_ids,
    )


CHAT = Endpoint("chat", ChatChunks, ChatCompletionResponse, _choice)
