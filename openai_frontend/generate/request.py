"""One request's record: the wire GenerateRequest the batcher reads, and what its answer needs.

Built once from the body (request_builder.py), followed and rendered from, and stored as the
request's meta as it is (request_meta.py, its prompt cut to the tail the detokenizer reads), so a
resume or a fetch by id on any gateway renders from the same record.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from common.protocol import GenerateRequest

Kind = Literal["completion", "chat"]
_ID_PREFIX: dict[Kind, str] = {"completion": "cmpl-", "chat": "chatcmpl-"}


class PreparedRequest(msgspec.Struct, kw_only=True, frozen=True):
    message: GenerateRequest  # as queued: id, prompt, sampling params, arrival, owner, priority
    kind: Kind  # which endpoint created it: the shape of its chunks and response
    model: str  # the model name the chunks show: a base model's, or a LoRA adapter's
    num_prompt_tokens: int  # the whole prompt's, for usage (a stored record keeps only its tail)
    stop: list[str]  # matched here on the output text, never sent to the worker
    stream: bool
    include_usage: bool  # streaming: add a final usage chunk
    return_token_ids: bool = False  # add generated token ids to each choice
    resumable: bool = False  # outlives its client's connection for the resume window
    n: int = 1  # choices asked for; each is a PreparedRequest of its own (see fan_out)
    logprobs: bool = False  # add logprobs to each choice
    echo_text: str | None = None  # completions with echo: the prompt text that starts each choice
    tool_parser: str | None = None  # chat with tools: the format tool calls are read back in
    max_tool_calls: int | None = None  # 1 with parallel_tool_calls false
    # vLLM's output options: special tokens shown, the stop string (or stop token) kept in the text.
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    continuous_usage: bool = False  # streaming: every chunk carries the usage so far
    prompt_logprobs: bool = False  # add the prompt's logprobs to the answer (vLLM's shape)
    # OpenAI's: the client's labels and end user, kept with the request and logged.
    metadata: dict[str, str] = {}
    safety_identifier: str = ""
    store: bool = False  # chat: kept as a stored chat completion once it finishes
    # Per function, its string parameters: formats that write values raw read them back by these.
    tool_strings: dict[str, list[str]] | None = None
    reasoning_parser: str | None = None  # chat with a model that thinks: how its thoughts are told apart
    reasoning_open: bool = False  # the prompt opened the thoughts: the output starts inside them
    # A LoRA adapter's request: the base model it runs on (None: `model` is the base model).
    base_model_name: str | None = None

    @property
    def req_id(self) -> str:
        return self.message.req_id

    @property
    def base_model(self) -> str:
        """The served base model whose tokenizer and rules the request is rendered by."""
        return self.base_model_name or self.model

    @property
    def created(self) -> int:
        """Unix seconds, as the chunks show it."""
        return int(self.message.arrival_time)

    @property
    def response_id(self) -> str:
        return response_id(self.kind, self.message.req_id)

    @property
    def echo_logprobs(self) -> bool:
        """Completions with echo and logprobs: the echoed prompt comes with its tokens' logprobs."""
        return self.echo_text is not None and self.logprobs


def with_message(request: PreparedRequest, **changes: Any) -> PreparedRequest:
    """The record with some of its message's fields changed (its id, its sampling params)."""
    return msgspec.structs.replace(request, message=msgspec.structs.replace(request.message, **changes))


def response_id(kind: Kind, req_id: str) -> str:
    """The OpenAI object's `id` (`cmpl-<req_id>` / `chatcmpl-<req_id>`)."""
    return _ID_PREFIX[kind] + req_id


def req_id_from(any_id: str) -> str:
    """Accepts the bare request id (`X-Request-Id`) or the OpenAI object's `id`."""
    for prefix in _ID_PREFIX.values():
        if any_id.startswith(prefix):
            return any_id[len(prefix) :]
    return any_id
