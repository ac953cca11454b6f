"""The Response object and its streamed events, built from a stored response (no I/O).

Events are numbered from 0 (`sequence_number`) in OpenAI's order: `response.created`,
`response.in_progress`, then for each output item (items.py) `response.output_item.added`,
its deltas and `response.output_item.done`: for a message `response.content_part.added`, one
`response.output_text.delta` per text delta, `response.output_text.done`, `response.content_part.done`;
for a function call `response.function_call_arguments.delta`s and `.done`; for the thoughts of a model
that thinks, `response.reasoning_text.delta`s and `.done`. Then
`response.completed` (or `response.incomplete` when max_output_tokens cut it). A request that fails
or is cancelled ends with `response.failed` instead. Replaying a token stream gives the same deltas,
so the same numbers: that is how `starting_after` resumes a stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from openai_frontend.follow.collect import Completed
from openai_frontend.follow.stream_out import StreamEvent
from openai_frontend.protocol.errors import OpenAIError, from_request_error
from openai_frontend.responses.items import (
    CallItem,
    Change,
    Item,
    MessageItem,
    OutputItems,
    ReasoningItem,
    output_items,
)
from openai_frontend.responses.schemas import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponseStatus,
    ResponseUsage,
)
from openai_frontend.responses.schemas import (
    ReasoningItem as ReasoningObject,
)
from openai_frontend.responses.store import ResponseResult, StoredResponse
from openai_frontend.responses.text import TEXT
from openai_frontend.responses.tools import tool_choice_echo

ItemStatus = Literal["in_progress", "completed", "incomplete"]

_CANCELLED_CODE = "request_aborted"  # the batcher's code for a request stopped before its end


def status_of_finish(finish_reason: str | None) -> ResponseStatus:
    return "incomplete" if finish_reason == "length" else "completed"


def status_of_error(code: str) -> ResponseStatus:
    return "cancelled" if code == _CANCELLED_CODE else "failed"


def result_of(done: Completed, completed_at: int, num_reasoning_tokens: int = 0) -> ResponseResult:
    return ResponseResult(
        completed_at=completed_at,
        text=done.text,
        num_output_tokens=done.num_output_tokens,
        num_cached_tokens=done.num_cached_tokens,
        num_reasoning_tokens=num_reasoning_tokens,
    )


def _item_status(status: ResponseStatus) -> ItemStatus:
    """The status of the item that was being written when the response ended as `status`."""
    return "incomplete" if status == "incomplete" else "completed"


OutputObject = ReasoningObject | OutputMessage | FunctionCallItem


def _output_item(item: Item, status: ItemStatus) -> OutputObject:
    if isinstance(item, ReasoningItem):
        return ReasoningObject(id=item.id, status=status, content=[ReasoningText(text=item.text)])
    if isinstance(item, MessageItem):
        return OutputMessage(id=item.id, status=status, content=[OutputText(text=item.text)])
    return FunctionCallItem(
        id=item.id, call_id=item.call_id, name=item.name, arguments=item.arguments, status=status
    )


def _output(stored: StoredResponse, text: str) -> list[OutputObject]:
    """Every item is done; only the last one can have been cut by max_output_tokens."""
    items = output_items(stored.params.request, text)
    last = _item_status(stored.status)
    return [_output_item(item, last if i == len(items) - 1 else "completed") for i, item in enumerate(items)]


def response_object(stored: StoredResponse) -> ResponseObject:
    params, status, result = stored.params, stored.status, stored.result
    output, usage, error = [], None, None
    if result is not None and status in ("completed", "incomplete"):
        output = _output(stored, result.text)
        prompt = params.request.num_prompt_tokens
        usage = ResponseUsage(
            input_tokens=prompt,
            input_tokens_details=InputTokensDetails(cached_tokens=result.num_cached_tokens),
            output_tokens=result.num_output_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=result.num_reasoning_tokens),
            total_tokens=prompt + result.num_output_tokens,
        )
    if result is not None and result.error is not None and status == "failed":
        openai_error = from_request_error(result.error)
        error = ResponseError(code=openai_error.code or "server_error", message=openai_error.message)
    return ResponseObject(
        id=params.id,
        created_at=params.request.created,
        completed_at=None if result is None or status != "completed" else result.completed_at,
        status=status,
        background=params.background,
        error=error,
        incomplete_details=IncompleteDetails() if status == "incomplete" else None,
        instructions=params.instructions,
        max_output_tokens=params.max_output_tokens,
        metadata=params.metadata,
        model=params.request.model,
        output=output,
        previous_response_id=params.previous_response_id,
        store=True,
        temperature=params.temperature,
        top_p=params.top_p,
        text={"format": params.text_format or TEXT},
        tools=params.tools or [],
        tool_choice=tool_choice_echo(params.tool_choice),
        parallel_tool_calls=params.parallel_tool_calls is not False,
        usage=usage,
        user=params.user,
    )


def response_body(stored: StoredResponse, *, store: bool = True) -> dict[str, Any]:
    body = response_object(stored).model_dump()
    body["store"] = store
    return body


@dataclass
class ResponseEvents:
    """One response's stream of typed events, numbered as they are made."""

    stored: StoredResponse
    store: bool = True
    _next: int = field(default=0, init=False)
    _items: OutputItems = field(init=False)

    def __post_init__(self) -> None:
        self._items = OutputItems(self.stored.params.request)

    def _event(self, type_: str, **fields: Any) -> StreamEvent:
        """The next event; its sequence number is where a resumed stream (`starting_after`) starts."""
        number = self._next
        self._next += 1
        data = json.dumps({"type": type_, "sequence_number": number, **fields})
        return StreamEvent(data, type=type_, position=(number,))

    def _events(self, changes: list[Change], status: ItemStatus = "completed") -> list[StreamEvent]:
        """The events of item changes; an item done at the response's end has its final `status`."""
        events = []
        for kind, index, piece in changes:
            item = self._items.items[index]
            at: dict[str, Any] = {"item_id": item.id, "output_index": index}
            if kind == "added":
                events += self._added(item, index)
            elif kind == "text":
                events.append(
                    self._event("response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
                )
            elif kind == "reasoning":
                events.append(
                    self._event("response.reasoning_text.delta", **at, content_index=0, delta=piece)
                )
            elif kind == "arguments":
                events.append(self._event("response.function_call_arguments.delta", **at, delta=piece))
            else:
                events += self._done(item, index, status)
        return events

    def _added(self, item: Item, index: int) -> list[StreamEvent]:
        """An item as it opens: a message without content, then its empty part; a call without arguments."""
        added = _output_item(item, "in_progress").model_dump()
        if isinstance(item, ReasoningItem):
            added["content"] = []
            return [self._event("response.output_item.added", output_index=index, item=added)]
        if isinstance(item, CallItem):
            added["arguments"] = ""
            return [self._event("response.output_item.added", output_index=index, item=added)]
        added["content"] = []
        at: dict[str, Any] = {"item_id": item.id, "output_index": index, "content_index": 0}
        return [
            self._event("response.output_item.added", output_index=index, item=added),
            self._event("response.content_part.added", **at, part=OutputText(text="").model_dump()),
        ]

    def _done(self, item: Item, index: int, status: ItemStatus) -> list[StreamEvent]:
        at: dict[str, Any] = {"item_id": item.id, "output_index": index}
        done = _output_item(item, status).model_dump()
        if isinstance(item, ReasoningItem):
            return [
                self._event("response.reasoning_text.done", **at, content_index=0, text=item.text),
                self._event("response.output_item.done", output_index=index, item=done),
            ]
        if isinstance(item, CallItem):
            return [
                self._event("response.function_call_arguments.done", **at, arguments=item.arguments),
                self._event("response.output_item.done", output_index=index, item=done),
            ]
        text, part = item.text, OutputText(text=item.text).model_dump()
        return [
            self._event("response.output_text.done", **at, content_index=0, text=text, logprobs=[]),
            self._event("response.content_part.done", **at, content_index=0, part=part),
            self._event("response.output_item.done", output_index=index, item=done),
        ]

    def opening(self) -> list[StreamEvent]:
        """`stored` as it was created: queued (background) or in progress, no result."""
        created = response_body(self.stored, store=self.store)
        running = response_body(StoredResponse(self.stored.params, "in_progress", None), store=self.store)
        return [
            self._event("response.created", response=created),
            self._event("response.in_progress", response=running),
            *self._events(self._items.opening()),
        ]

    def delta(self, text: str) -> list[StreamEvent]:
        return self._events(self._items.feed(text))

    def finish(self) -> list[StreamEvent]:
        """The text has ended: what was held back (a tool parser's undecided end)."""
        return self._events(self._items.finish())

    def closing(self, ended: StoredResponse) -> list[StreamEvent]:
        assert ended.result is not None
        final = "response.incomplete" if ended.status == "incomplete" else "response.completed"
        return [
            *self._events(self._items.close(), _item_status(ended.status)),
            self._event(final, response=response_body(ended, store=self.store)),
        ]

    def failed(self, ended: StoredResponse) -> StreamEvent:
        return self._event("response.failed", response=response_body(ended, store=self.store))

    def error(self, error: OpenAIError) -> StreamEvent:
        """The stream stops without an end (a timeout, Redis gone): the response may still finish."""
        return self._event("error", code=error.code, message=error.message, param=error.param)
