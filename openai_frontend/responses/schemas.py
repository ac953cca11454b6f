"""Bodies of the Responses API (`/v1/responses`): the request, its input items, the Response object.

The request is strict like the other endpoints' (an unknown field is a 400 naming it). Fields OpenAI
defines that we do not implement are declared, so that `responses_input.check_unsupported` refuses
them by name with `unsupported_parameter` instead of ignoring them. Input items and their content
parts accept extra fields, so that an item kind we do not serve (a reasoning item, an image) is
refused by its `type` rather than by a field it happens to carry.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from openai_frontend.protocol.strings import Description, Id, JSONObject, Name, Text, Word

ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
TERMINAL: tuple[ResponseStatus, ...] = ("completed", "incomplete", "failed", "cancelled")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class InputPart(_Open):
    type: Word  # input_text, and output_text in an assistant turn sent back; other kinds are refused
    text: Text | None = None


class InputItem(_Open):
    type: Word | None = None  # "message" (or absent), "function_call", "function_call_output"
    role: Word | None = None  # a message's
    content: Text | list[InputPart] | None = None  # a message's
    call_id: Id | None = None  # a function call's, and the call a function_call_output answers
    name: Text | None = None  # a function call's, as the model wrote it (strings.py: not capped)
    arguments: Text | None = None  # a function call's, JSON text
    output: Text | list[InputPart] | None = None  # a function_call_output's


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextFormat(_Strict):
    """`text.format`: "text", "json_object", or "json_schema" with the fields below (text.py)."""

    type: Word
    name: Name | None = None  # json_schema: required, 1 to 64 letters, digits, '_' or '-'
    description: Description | None = None
    # `schema` would shadow a BaseModel attribute; the body still spells it `schema`.
    schema_: JSONObject | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the schema is always enforced, strict or not


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Word | None = None  # only "medium", OpenAI's default, is accepted


class ResponsesRequest(_Strict):
    model: Id | None = None
    input: Text | list[InputItem]
    instructions: Text | None = None  # a system message before the input, not carried to the next turn
    previous_response_id: Id | None = None  # continue that response's conversation
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    background: bool | None = False  # answer at once; the response runs on and is fetched later
    store: bool | None = True  # keep the response (GET, previous_response_id); needed by background
    metadata: dict[Text, Text] | None = None  # echoed back: up to 16 pairs
    user: Text | None = None
    # vLLM's sampling extensions, as on the other endpoints.
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[Text, float] | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = False
    text: TextConfig | None = None  # the output's format (see text.py)
    # Function tools (tools.py): run as chat's tools.
    tools: list[JSONObject] | None = None
    tool_choice: Word | JSONObject | None = None  # none, auto, required or {"type": "function", "name"}
    parallel_tool_calls: bool | None = None  # false: at most one call
    # OpenAI fields we do not implement: refused by name in responses_input.check_unsupported.
    max_tool_calls: int | None = None
    reasoning: JSONObject | None = None
    include: list[Text] | None = None
    truncation: Word | None = None
    top_logprobs: int | None = None
    stream_options: JSONObject | None = None
    background_options: JSONObject | None = None
    conversation: Id | JSONObject | None = None
    context_management: list[JSONObject] | None = None
    prompt: JSONObject | None = None
    prompt_cache_key: Id | None = None
    prompt_cache_retention: Word | None = None
    prompt_cache_options: JSONObject | None = None
    safety_identifier: Text | None = None
    service_tier: Word | None = None
    moderation: JSONObject | None = None
    image: JSONObject | None = None
    access_programs: JSONObject | None = None


# ----- the Response object (openai.types.responses.Response) ----------------------------------------
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """The model's thoughts (a reasoning parser split them off), before its answer."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[Any] = []  # no summaries are written: the thoughts are given as they are
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0  # input tokens whose KV came from the prefix cache


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: ResponseStatus
    background: bool
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    metadata: dict[str, str]
    model: str
    output: list[ReasoningItem | OutputMessage | FunctionCallItem]
    parallel_tool_calls: bool = True
    previous_response_id: str | None
    store: bool
    temperature: float | None
    top_p: float | None
    text: dict[str, Any] = {"format": {"type": "text"}}
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = []
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None
