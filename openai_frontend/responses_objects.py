"""The Response object and its streamed events, built from a stored response (no I/O).

Events are numbered from 0 (`sequence_number`) in OpenAI's order: `response.created`,
`response.in_progress`, `response.output_item.added`, `response.content_part.added`, one
`response.output_text.delta` per text delta, `response.output_text.done`,
`response.content_part.done`, `response.output_item.done`, then `response.completed` (or
`response.incomplete` when max_output_tokens cut it). A request that fails or is cancelled ends with
`response.failed` instead. Replaying a token stream gives the same deltas, so the same numbers:
that is how `starting_after` resumes a stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from openai_frontend.collect import Completed
from openai_frontend.errors import OpenAIError, from_request_error
from openai_frontend.responses_schemas import (
    IncompleteDetails,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseObject,
    ResponseStatus,
    ResponseUsage,
)
from openai_frontend.responses_store import ResponseResult, StoredResponse
from openai_frontend.responses_text import TEXT

_CANCELLED_CODE = "request_aborted"  # the batcher's code for a request stopped before its end


def status_of_finish(finish_reason: str | None) -> ResponseStatus:
    return "incomplete" if finish_reason == "length" else "completed"


def status_of_error(code: str) -> ResponseStatus:
    return "cancelled" if code == _CANCELLED_CODE else "failed"


def result_of(done: Completed, completed_at: int) -> ResponseResult:
    return ResponseResult(
        completed_at=completed_at,
        text=done.text,
        num_output_tokens=done.num_output_tokens,
        num_cached_tokens=done.num_cached_tokens,
    )


def _message(stored: StoredResponse, text: str, status: ResponseStatus) -> OutputMessage:
    item_status = "incomplete" if status == "incomplete" else "completed"
    if status in ("queued", "in_progress"):
        item_status = "in_progress"
    return OutputMessage(id=stored.spec.message_id, status=item_status, content=[OutputText(text=text)])


def response_object(stored: StoredResponse) -> ResponseObject:
    spec, status, result = stored.spec, stored.status, stored.result
    output, usage, error = [], None, None
    if result is not None and status in ("completed", "incomplete"):
        output = [_message(stored, result.text, status)]
        prompt = spec.request.num_prompt_tokens
        usage = ResponseUsage(
            input_tokens=prompt,
            input_tokens_details=InputTokensDetails(cached_tokens=result.num_cached_tokens),
            output_tokens=result.num_output_tokens,
            total_tokens=prompt + result.num_output_tokens,
        )
    if result is not None and result.error is not None and status == "failed":
        openai_error = from_request_error(result.error)
        error = ResponseError(code=openai_error.code or "server_error", message=openai_error.message)
    return ResponseObject(
        id=spec.id,
        created_at=spec.request.created,
        completed_at=None if result is None or status != "completed" else result.completed_at,
        status=status,
        background=spec.background,
        error=error,
        incomplete_details=IncompleteDetails() if status == "incomplete" else None,
        instructions=spec.instructions,
        max_output_tokens=spec.max_output_tokens,
        metadata=spec.metadata,
        model=spec.request.model,
        output=output,
        previous_response_id=spec.previous_response_id,
        store=True,
        temperature=spec.temperature,
        top_p=spec.top_p,
        text={"format": spec.text_format or TEXT},
        usage=usage,
        user=spec.user,
    )


def response_body(stored: StoredResponse, *, store: bool = True) -> dict[str, Any]:
    body = response_object(stored).model_dump()
    body["store"] = store
    return body


Event = tuple[int, str, str]  # sequence number, event type, JSON data


@dataclass
class ResponseEvents:
    """One response's stream of typed events, numbered as they are made."""

    stored: StoredResponse
    store: bool = True
    _next: int = field(default=0, init=False)

    def _event(self, type_: str, **fields: Any) -> Event:
        number = self._next
        self._next += 1
        return number, type_, json.dumps({"type": type_, "sequence_number": number, **fields})

    def _part(self, text: str) -> dict[str, Any]:
        return OutputText(text=text).model_dump()

    def _item(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": self.stored.spec.message_id, "output_index": 0, "content_index": 0, **fields}

    def opening(self) -> list[Event]:
        """`stored` as it was created: queued (background) or in progress, no result."""
        created = response_body(self.stored, store=self.store)
        running = response_body(StoredResponse(self.stored.spec, "in_progress", None), store=self.store)
        item = _message(self.stored, "", "in_progress").model_dump()
        item["content"] = []
        return [
            self._event("response.created", response=created),
            self._event("response.in_progress", response=running),
            self._event("response.output_item.added", output_index=0, item=item),
            self._event("response.content_part.added", **self._item({"part": self._part("")})),
        ]

    def delta(self, text: str) -> Event:
        return self._event("response.output_text.delta", **self._item({"delta": text, "logprobs": []}))

    def closing(self, ended: StoredResponse) -> list[Event]:
        assert ended.result is not None
        text = ended.result.text
        item = _message(ended, text, ended.status).model_dump()
        final = "response.incomplete" if ended.status == "incomplete" else "response.completed"
        return [
            self._event("response.output_text.done", **self._item({"text": text, "logprobs": []})),
            self._event("response.content_part.done", **self._item({"part": self._part(text)})),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event(final, response=response_body(ended, store=self.store)),
        ]

    def failed(self, ended: StoredResponse) -> Event:
        return self._event("response.failed", response=response_body(ended, store=self.store))

    def error(self, error: OpenAIError) -> Event:
        """The stream stops without an end (a timeout, Redis gone): the response may still finish."""
        return self._event("error", code=error.code, message=error.message, param=error.param)
