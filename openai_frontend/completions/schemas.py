"""The answers of /v1/chat/completions and /v1/completions: bodies, streamed chunks, logprobs, usage.

The requests they answer are `protocol/openai_schemas.py`'s, which every API surface builds (the
Responses and Messages APIs run as chat requests); these shapes are only the two endpoints' own.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


def response_exclude(*, return_token_ids: bool, include_usage: bool = True) -> dict[str, Any] | None:
    """What a response or chunk leaves out: `token_ids` unless asked for, `usage` on chunks unless
    the client asked for usage (OpenAI then sends `usage: null` on every chunk)."""
    exclude: dict[str, Any] = {} if include_usage else {"usage": True}
    if not return_token_ids:
        exclude["choices"] = {"__all__": {"token_ids"}}
    return exclude or None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0  # the thoughts' tokens (openai_frontend/reasoning/)


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()
    # Only for a model that thinks (a reasoning parser), as vLLM gives it.
    completion_tokens_details: CompletionTokensDetails | None = Field(
        default=None, exclude_if=lambda details: details is None
    )


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists, one entry per generated token."""

    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []  # character offset of each token in the choice's text


class PromptLogprob(BaseModel):
    """vLLM's Logprob: one token of one prompt position."""

    logprob: float
    rank: int | None  # 1 for the most likely token; null when not among the top ones
    decoded_token: str


# vLLM's prompt_logprobs: per prompt token, null for the first, else token id -> its PromptLogprob.
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # only with return_token_ids
    # Only with prompt_logprobs (left out otherwise, as vLLM leaves it null).
    prompt_logprobs: PromptLogprobs | None = Field(default=None, exclude_if=lambda v: v is None)


class CompletionResponse(BaseModel):
    """Non-streaming answer, and (with `usage` left out or null) each streamed chunk."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # null when the model only called tools
    # The model's thoughts (a reasoning parser split them off), as vLLM names them; left out without.
    reasoning_content: str | None = Field(default=None, exclude_if=lambda text: text is None)
    # Left out when there are none, as OpenAI leaves it out.
    tool_calls: list[ToolCall] | None = Field(default=None, exclude_if=lambda calls: not calls)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None  # UTF-8 bytes of `token`


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]  # most likely first


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # only with return_token_ids


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    # Only with prompt_logprobs: vLLM puts the (one) prompt's on the response, not on a choice.
    prompt_logprobs: PromptLogprobs | None = Field(default=None, exclude_if=lambda v: v is None)


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: dict[str, Any]  # only the fields that changed: role first, then content and tool_calls
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # only with return_token_ids


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
