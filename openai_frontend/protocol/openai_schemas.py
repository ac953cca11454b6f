"""Request bodies of the OpenAI API subset the gateway serves, and its model list.

Every API surface builds these requests (a Responses or Messages request runs as a chat request);
the answers of the two completions endpoints are completions/schemas.py's.

Request models are strict, as OpenAI is: an unknown field, a wrong type (no coercion: `"10"` is not
an int) or a string that is not valid Unicode is a 400 naming the field (see errors.py). Fields OpenAI
defines that we do not implement are declared, so that `validation.check_unsupported` can refuse them
by name instead of ignoring them. Value ranges are checked in `validation.py`; the strings a client
names or identifies things with are capped (strings.py), each past its cap a 400 naming it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from openai_frontend.protocol.strings import Description, Id, JSONObject, Name, Text, Word


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = False  # end the stream with a chunk that carries usage
    # vLLM's: with include_usage, every chunk also carries the usage so far (guidellm asks for it).
    continuous_usage_stats: bool | None = False


class StructuredOutputsParams(_Strict):
    """vLLM's `structured_outputs` extension: exactly one constraint (see structured/constraint.py)."""

    # A JSON schema, as an object or JSON text (`json` would shadow a BaseModel method).
    json_: JSONObject | Text | None = Field(default=None, alias="json")
    regex: Text | None = None
    choice: list[Text] | None = None  # the output is exactly one of these
    grammar: Text | None = None  # EBNF (GBNF), the root rule named `root`
    json_object: bool | None = None  # any JSON object
    # vLLM's other options; refused by name.
    whitespace_pattern: Text | None = None
    structural_tag: Text | None = None
    disable_fallback: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None


class JSONSchemaFormat(_Strict):
    """`response_format.json_schema`, as OpenAI defines it."""

    name: Name
    description: Description | None = None
    # `schema` would shadow a BaseModel attribute; the body still spells it `schema`.
    schema_: JSONObject | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Word  # "text", "json_object" or "json_schema"
    json_schema: JSONSchemaFormat | None = None


class _SamplingRequest(_Strict):
    model: Id | None = None  # must name the served model when given
    max_tokens: int | None = None  # default: whatever room the context has left
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # -1 or 0: off
    seed: int | None = None
    stop: Text | list[Text] | None = None  # matched on the output text
    stop_token_ids: list[int] | None = None
    min_p: float | None = None  # vLLM: drop tokens under min_p x the top token's probability
    presence_penalty: float | None = None  # [-2, 2], over output tokens
    frequency_penalty: float | None = None  # [-2, 2], per occurrence in the output
    repetition_penalty: float | None = None  # vLLM / HF: > 0, over prompt + output, 1 is off
    logit_bias: dict[Word, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    min_tokens: int | None = None  # vLLM: EOS / stop_token_ids cannot end the output before this
    # null is accepted wherever OpenAI accepts it, meaning the default.
    ignore_eos: bool | None = False
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    # vLLM's extension: also return the generated token ids with each choice (tests compare them).
    return_token_ids: bool | None = False
    # vLLM's extension: the output follows a JSON schema, regex, choice or grammar (both endpoints).
    structured_outputs: StructuredOutputsParams | None = None
    # vLLM's detokenizer and stop options (docs/api.md).
    skip_special_tokens: bool | None = True  # false: special tokens show in the text
    spaces_between_special_tokens: bool | None = True  # slow tokenizers only; ours are fast
    include_stop_str_in_output: bool | None = False  # the stop string (or EOS token) ends the text
    add_special_tokens: bool | None = None  # default: true for a completion prompt, false for chat
    truncate_prompt_tokens: int | None = None  # keep only the prompt's last N tokens (-1: the context)
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob and this many top ones
    priority: int | None = None  # vLLM's: lower runs first; within what the API key may use
    # OpenAI's: kept with the request and logged (metadata up to 16 string pairs).
    metadata: dict[Text, Text] | None = None
    store: bool | None = None  # chat: kept for GET /v1/chat/completions/{id}
    service_tier: Word | None = None  # refused by name, but for "auto" and "default"
    safety_identifier: Text | None = None  # the end user: recorded, the tenant of rate limits
    prompt_cache_key: Id | None = None  # requests with the same key are placed together
    # Ours: the request outlives its connection for GATEWAY_RESUME_GRACE_S, so that its client can
    # resume it (GET /v1/requests/{id}/stream). Otherwise a client that goes away cancels it.
    resumable: bool | None = False


class CompletionRequest(_SamplingRequest):
    prompt: Text | list[int] | list[Text] | list[list[int]]  # one prompt: text or token ids
    echo: bool | None = False  # prepend the prompt text to each choice
    logprobs: int | None = None  # 0..20: the sampled token's logprob plus this many most likely
    best_of: int | None = None  # only best_of == n (no ranking of extra candidates)
    suffix: Text | None = None  # not supported yet


class ContentPart(_Strict):
    type: Word  # only "text" is supported; the other kinds OpenAI defines are refused by name
    text: Text | None = None
    image_url: JSONObject | None = None
    input_audio: JSONObject | None = None
    file: JSONObject | None = None
    refusal: Text | None = None


class ChatMessage(_Strict):
    role: Word
    content: Text | list[ContentPart] | None = None
    name: Name | None = None  # the participant's; OpenAI's cap, without its [a-zA-Z0-9_-] pattern
    tool_calls: list[JSONObject] | None = None  # an assistant's calls (tools/history.py)
    tool_call_id: Id | None = None  # the call a tool message answers
    reasoning_content: Text | None = None  # an assistant's thoughts, as vLLM returns them (reasoning/)
    # Turns OpenAI defines that are not implemented; refused by name.
    function_call: JSONObject | None = None
    refusal: Text | None = None
    audio: JSONObject | None = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # newer name of max_tokens; wins when both are given
    logprobs: bool | None = None  # return the sampled tokens' logprobs
    top_logprobs: int | None = None  # 0..20 most likely tokens per position (needs logprobs)
    response_format: ResponseFormat | None = None  # text, json_object or json_schema
    # Function tools (tools.py): the template lists them, the output is parsed for calls.
    tools: list[JSONObject] | None = None
    tool_choice: Word | JSONObject | None = None  # none, auto, required or {"type": "function", ...}
    parallel_tool_calls: bool | None = None  # false: at most one call
    # vLLM's template controls: extra variables for the chat template (e.g. enable_thinking), the
    # generation prompt, and continuing the last (assistant) message instead of starting a new one.
    chat_template_kwargs: JSONObject | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    # OpenAI fields we do not implement: refused by name in validation.check_unsupported.
    functions: list[JSONObject] | None = None
    function_call: Word | JSONObject | None = None
    audio: JSONObject | None = None
    modalities: list[Word] | None = None
    prediction: JSONObject | None = None
    web_search_options: JSONObject | None = None
    # Handed to the chat template; refused when the template does not read them.
    reasoning_effort: Word | None = None
    verbosity: Word | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "cbserve"
    root: str  # the model's name, as vLLM's `root` names the model (never a filesystem path)
    parent: str | None = None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
