"""The answers of /v1/chat/completions: the role first, content (and tool call) deltas, optional
usage; or one body. With tools or a model that thinks, each choice's text goes through its answer
parser (reasoning/answer_parser.py): thoughts become `reasoning_content`, calls `tool_calls`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openai_frontend.completions.endpoint import Chunks, Endpoint
from openai_frontend.completions.logprobs import LogprobsFormatter
from openai_frontend.completions.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionTokensDetails,
    FunctionCall,
    ToolCall,
    UsageInfo,
)
from openai_frontend.follow.collect import Completed
from openai_frontend.follow.request_follower import Output
from openai_frontend.generate.parsers import answer_parser
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.reasoning.answer_parser import AnswerParser
from openai_frontend.reasoning.usage import ReasoningCounter, num_reasoning_tokens
from openai_frontend.tools.parsers import ToolCallDelta


def _finish_reason(finish_reason: str | None, parser: AnswerParser | None) -> str | None:
    # As OpenAI and vLLM: a turn that ended by itself after calling tools ends with "tool_calls".
    return (
        "tool_calls"
        if finish_reason == "stop" and parser is not None and parser.made_calls
        else finish_reason
    )


def _tool_call_deltas(calls: list[ToolCallDelta]) -> list[dict[str, Any]]:
    """OpenAI's streamed calls: the first piece of a call carries its id, type and name, later pieces
    only arguments; pieces of one call in one chunk are joined."""
    deltas: list[dict[str, Any]] = []
    for call in calls:
        if deltas and deltas[-1]["index"] == call.index:
            deltas[-1]["function"]["arguments"] += call.arguments
            continue
        function: dict[str, Any] = {"arguments": call.arguments}
        delta: dict[str, Any] = {"index": call.index, "function": function}
        if call.id is not None:
            function["name"] = call.name
            delta = {"index": call.index, "id": call.id, "type": "function", "function": function}
        deltas.append(delta)
    return deltas


class ChatChunks(Chunks):
    chunk_type = ChatCompletionChunk

    def __post_init__(self) -> None:
        super().__post_init__()
        self._parsers = {i: answer_parser(request) for i, request in enumerate(self.choices)}
        self._reasoning = {
            i: ReasoningCounter(request.reasoning_open, self.logprobs.token_text, request.reasoning_parser)
            for i, request in enumerate(self.choices)
            if request.reasoning_parser is not None
        }

    def opening(self) -> list[str]:
        return [
            self._chunk(
                [ChatChunkChoice(index=i, delta={"role": "assistant", "content": ""})], self.usage_so_far(i)
            )
            for i in range(self.request.n)
        ]

    def delta(self, index: int, out: Output) -> str | None:
        logprobs = self.logprobs.chat(out.events) if self.request.logprobs else None
        if (counter := self._reasoning.get(index)) is not None:
            counter.add(out.token_ids)
        parser = self._parsers.get(index)
        if parser is None:
            delta: dict[str, Any] = {"content": out.text} if out.text else {}
            return self._delta_chunk(ChatChunkChoice, index, out, delta=delta, logprobs=logprobs)
        parsed = parser.feed(out.text)
        if out.finish_reason is not None:
            parsed = parsed.then(parser.finish())
        delta = {"reasoning_content": parsed.reasoning} if parsed.reasoning else {}
        if parsed.content:
            delta["content"] = parsed.content
        if parsed.tool_calls:
            delta["tool_calls"] = _tool_call_deltas(parsed.tool_calls)
        if not delta and out.finish_reason is None and logprobs is None and not self.request.return_token_ids:
            return None  # text the parser holds back (a call's head): no event, as for text not yet decoded
        finish_reason = _finish_reason(out.finish_reason, parser)
        return self._delta_chunk(
            ChatChunkChoice, index, out, delta=delta, logprobs=logprobs, finish_reason=finish_reason
        )

    def usage(self, usage: UsageInfo) -> str:
        if self._reasoning:
            usage = with_reasoning(usage, sum(c.num_tokens for c in self._reasoning.values()))
        return super().usage(usage)


def with_reasoning(usage: UsageInfo, num_reasoning_tokens: int) -> UsageInfo:
    details = CompletionTokensDetails(reasoning_tokens=num_reasoning_tokens)
    return usage.model_copy(update={"completion_tokens_details": details})


def _message(done: Completed, parser: AnswerParser | None) -> AssistantMessage:
    if parser is None:
        return AssistantMessage(content=done.text)
    parsed = parser.feed(done.text).then(parser.finish())
    calls: dict[int, ToolCall] = {}
    for call in parsed.tool_calls:
        if call.id is not None:
            calls[call.index] = ToolCall(
                id=call.id, function=FunctionCall(name=call.name or "", arguments="")
            )
        calls[call.index].function.arguments += call.arguments
    return AssistantMessage(
        content=parsed.content or (None if calls else ""),
        reasoning_content=parsed.reasoning or None,
        tool_calls=list(calls.values()),
    )


def _choice(
    index: int, done: Completed, request: PreparedRequest, formatter: LogprobsFormatter
) -> ChatChoice:
    parser = answer_parser(request)
    return ChatChoice(
        index=index,
        message=_message(done, parser),
        logprobs=formatter.chat(done.events) if request.logprobs else None,
        finish_reason=_finish_reason(done.finish_reason, parser),
        token_ids=done.token_ids,
    )


class ChatEndpoint(Endpoint):
    def body(self, requests: Sequence[PreparedRequest], done: list[Completed], *rest: Any) -> dict[str, Any]:
        """The body, with the thoughts' tokens in its usage when the model thinks (`rest`: the id,
        creation time, model and logprobs formatter, as Endpoint.body takes them)."""
        body = super().body(requests, done, *rest)
        formatter: LogprobsFormatter = rest[-1]
        if any(request.reasoning_parser is not None for request in requests):
            reasoning_tokens = sum(
                num_reasoning_tokens(
                    r.reasoning_parser, r.reasoning_open, choice.token_ids, formatter.token_text
                )
                for r, choice in zip(requests, done, strict=True)
            )
            body["usage"]["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        return body


CHAT = ChatEndpoint("chat", ChatChunks, ChatCompletionResponse, _choice)
