"""The parsers a request's record names, for one choice's text: thoughts first (reasoning/), then tool
calls in the answer (tools/parsers/). Chat, the Responses and the Messages API read answers through it."""

from __future__ import annotations

from openai_frontend.generate.request import PreparedRequest
from openai_frontend.reasoning.answer_parser import AnswerParser
from openai_frontend.reasoning.parser import new_reasoning_parser
from openai_frontend.tools.parsers import new_parser


def answer_parser(request: PreparedRequest) -> AnswerParser | None:
    """None when the choice's text is all content."""
    if request.tool_parser is None and request.reasoning_parser is None:
        return None
    tools = None
    if request.tool_parser is not None:
        tools = new_parser(request.tool_parser, request.req_id, request.max_tool_calls, request.tool_strings)
    reasoning = None
    if request.reasoning_parser is not None:
        reasoning = new_reasoning_parser(request.reasoning_parser, request.reasoning_open)
    return AnswerParser(reasoning, tools)
