"""The answers of /v1/chat/completions: the role first, content (and tool call) deltas, optional
usage; or one body. With tools, each choice's text goes through its tool parser (tools/parsers/)."""

from __future__ import annotations

from typing import Any

from openai_frontend.follow.collect import Completed
from openai_frontend.follow.request_runner import Output
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.protocol.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    FunctionCall,
    ToolCall,
)
from openai_frontend.render.answer import Chunks, Endpoint
from openai_frontend.render.logprobs import LogprobsFormatter
from openai_frontend.tools.parsers import ParsedDelta, ToolCallDelta, ToolParser, new_parser


def _parser(request: PreparedRequest) -> ToolParser | None:
    if request.tool_parser is None:
        return None
    return new_parser(request.tool_parser, request.req_id, request.max_tool_calls, request.tool_strings)


def _finish_reason(finish_reason: str | None, parser: ToolParser | None) -> str | None:
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
        self._parsers = {i: _parser(request) for i, request in enumerate(self.choices)}

    def opening(self) -> list[str]:
        return [
            self._chunk(
                [ChatChunkChoice(index=i, delta={"role": "assistant", "content": ""})], self.usage_so_far(i)
            )
            for i in range(self.request.n)
        ]

    def delta(self, index: int, out: Output) -> str | None:
        logprobs = self.logprobs.chat(out.events) if self.request.logprobs else None
        parser = self._parsers.get(index)
        if parser is None:
            delta: dict[str, Any] = {"content": out.text} if out.text else {}
            return self._delta_chunk(ChatChunkChoice, index, out, delta=delta, logprobs=logprobs)
        parsed = parser.feed(out.text)
        if out.finish_reason is not None:
            end = parser.finish()
            parsed = ParsedDelta(parsed.content + end.content, parsed.tool_calls + end.tool_calls)
        delta = {"content": parsed.content} if parsed.content else {}
        if parsed.tool_calls:
            delta["tool_calls"] = _tool_call_deltas(parsed.tool_calls)
        if not delta and out.finish_reason is None and logprobs is None and not self.request.return_token_ids:
            return None  # text the parser holds back (a call's head): no event, as for text not yet decoded
        finish_reason = _finish_reason(out.finish_reason, parser)
        return self._delta_chunk(
            ChatChunkChoice, index, out, delta=delta, logprobs=logprobs, finish_reason=finish_reason
        )


def _message(done: Completed, parser: ToolParser | None) -> AssistantMessage:
    if parser is None:
        return AssistantMessage(content=done.text)
    parsed = parser.feed(done.text)
    end = parser.finish()
    calls: dict[int, ToolCall] = {}
    for call in parsed.tool_calls + end.tool_calls:
        if call.id is not None:
            calls[call.index] = ToolCall(
                id=call.id, function=FunctionCall(name=call.name or "", arguments="")
            )
        calls[call.index].function.arguments += call.arguments
    content = parsed.content + end.content
    return AssistantMessage(content=content or (None if calls else ""), tool_calls=list(calls.values()))


def _choice(
    index: int, done: Completed, request: PreparedRequest, formatter: LogprobsFormatter
) -> ChatChoice:
    parser = _parser(request)
    return ChatChoice(
        index=index,
        message=_message(done, parser),
        logprobs=formatter.chat(done.events) if request.logprobs else None,
        finish_reason=_finish_reason(done.finish_reason, parser),
        token_ids=done.token_ids,
    )


CHAT = Endpoint("chat", ChatChunks, ChatCompletionResponse, _choice)
