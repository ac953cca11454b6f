"""The Message object of an answer: its content blocks, stop reason and usage (no I/O).

The blocks are the output items the Responses API reads from the text (responses/items.py): a text
block for text, a `tool_use` block for each call the request's tool parser finds, in the order
written. A call's `input` is its arguments parsed; arguments cut by `max_tokens` are parsed as far as
they go, as the SDK's stream accumulator parses them.
"""

from __future__ import annotations

from typing import Any

import pydantic_core

from openai_frontend.follow.collect import Completed
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.responses.items import CallItem, Item, ReasoningItem, output_items

_CALL_PREFIX, _TOOL_USE_PREFIX = "call_", "toolu_"


def message_id(request: PreparedRequest) -> str:
    return "msg_" + request.req_id


def tool_use_id(call_id: str) -> str:
    """Anthropic's id for a call (toolu_...), from the parser's (call_...): the same digest."""
    return _TOOL_USE_PREFIX + call_id.removeprefix(_CALL_PREFIX)


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as its `input`: whole, or as far as they were written."""
    try:
        parsed = pydantic_core.from_json(arguments or "{}", allow_partial=True)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def opened_block(item: Item) -> dict[str, Any]:
    """A block as `content_block_start` shows it: before any of its text or input."""
    if isinstance(item, CallItem):
        return {"type": "tool_use", "id": tool_use_id(item.call_id), "name": item.name, "input": {}}
    if isinstance(item, ReasoningItem):  # a thinking model's thoughts (reasoning/): unsigned
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "text", "text": ""}


def block(item: Item) -> dict[str, Any]:
    if isinstance(item, CallItem):
        return {**opened_block(item), "input": tool_input(item.arguments)}
    if isinstance(item, ReasoningItem):
        return {**opened_block(item), "thinking": item.text}
    return {"type": "text", "text": item.text}


def stop_sequence(request: PreparedRequest, done: Completed, tokenizer: ModelTokenizer) -> str | None:
    """The stop sequence that ended the answer, if one did: the gateway, not the worker, ended it
    (its last token event has no finish reason), and the earliest stop string in the whole output
    text (the text shown is cut before it) is the one that matched."""
    if done.finish_reason != "stop" or not request.stop or not done.events:
        return None
    if done.events[-1].finish_reason is not None:  # EOS or a stop token id
        return None
    text = tokenizer.decode(done.token_ids)
    found = [(at, i) for i, stop in enumerate(request.stop) if (at := text.find(stop)) != -1]
    return request.stop[min(found)[1]] if found else None


def stop_reason(finish_reason: str | None, matched: str | None, made_calls: bool) -> str:
    if finish_reason == "length":
        return "max_tokens"
    if matched is not None:
        return "stop_sequence"
    return "tool_use" if made_calls else "end_turn"


def usage(request: PreparedRequest, num_output_tokens: int) -> dict[str, int]:
    """The whole prompt is `input_tokens` (what count_tokens gives): the prefix cache is automatic,
    with no cache writes or reads to bill apart, so the cache fields are left out."""
    return {"input_tokens": request.num_prompt_tokens, "output_tokens": num_output_tokens}


def message_object(
    request: PreparedRequest,
    content: list[dict[str, Any]],
    stop: tuple[str | None, str | None] = (None, None),
    num_output_tokens: int = 0,
) -> dict[str, Any]:
    """The Message; `stop` is (stop_reason, stop_sequence), both None while it is being written."""
    return {
        "id": message_id(request),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage(request, num_output_tokens),
    }


def message_body(request: PreparedRequest, done: Completed, tokenizer: ModelTokenizer) -> dict[str, Any]:
    """The non-streaming answer."""
    items = output_items(request, done.text)
    matched = stop_sequence(request, done, tokenizer)
    made_calls = any(isinstance(item, CallItem) for item in items)
    reason = stop_reason(done.finish_reason, matched, made_calls)
    return message_object(request, [block(item) for item in items], (reason, matched), done.num_output_tokens)
