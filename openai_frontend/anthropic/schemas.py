"""Request bodies of the Anthropic Messages API, as strict as the OpenAI ones (openai_schemas.py).

Blocks and tools allow any field at parse time, so that a block of a kind we do not serve (an image, a
document, a thinking block) or a server tool is refused by its kind, by name, rather than as an
unknown field; the fields each supported kind may carry are checked in input.py. Fields of the API we
do not implement are declared so that they are refused by name too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from openai_frontend.protocol.strings import Description, Id, JSONObject, Name, Text, Word


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ContentBlock(BaseModel):
    """One block of a message, `system` or a tool result: text, image, tool_use or tool_result here."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: Word
    text: Text | None = None  # text
    id: Id | None = None  # tool_use: the call's id, which a tool_result names
    name: Text | None = None  # tool_use: the tool called, as the model wrote it (strings.py: not capped)
    input: JSONObject | None = None  # tool_use: its arguments
    tool_use_id: Id | None = None  # tool_result: the call it answers
    content: Text | list[ContentBlock] | None = None  # tool_result: the tool's output
    is_error: bool | None = None  # tool_result: the tool failed (its output says how)
    source: JSONObject | None = (
        None  # image: {"type": "base64", "media_type", "data"} or {"type": "url", "url"}
    )
    # A prompt-caching breakpoint: our prefix cache is automatic, so it changes nothing.
    cache_control: JSONObject | None = None


class Message(_Strict):
    role: Word  # user or assistant
    content: Text | list[ContentBlock]


class Tool(BaseModel):
    """A client tool (`type` absent or "custom"); Anthropic's server tools are refused by type."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: Word | None = None
    name: Name | None = None
    description: Description | None = None
    input_schema: JSONObject | None = None
    strict: bool | None = None  # the input follows input_schema exactly (a grammar, as chat's strict)
    cache_control: JSONObject | None = None


class CountTokensRequest(_Strict):
    """POST /v1/messages/count_tokens: what makes the prompt."""

    model: Id
    messages: list[Message]
    system: Text | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: JSONObject | None = None  # {"type": auto | any | tool | none, "name", ...}
    thinking: JSONObject | None = None  # only {"type": "disabled"}: the model does not think aloud
    output_config: JSONObject | None = None  # its `format` (a JSON schema) is served; `effort` is not
    cache_control: JSONObject | None = None  # automatic prompt caching: ours always is
    # The API's fields we do not implement: refused by name.
    mcp_servers: list[Any] | None = None
    context_management: JSONObject | None = None
    container: Any = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int
    metadata: JSONObject | None = None  # only user_id, kept with the request as chat's `user`
    stop_sequences: list[Text] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    service_tier: Word | None = None  # auto or standard_only: there is one tier
    # The API's fields we do not implement: refused by name.
    inference_geo: Word | None = None
    speed: Word | None = None
    diagnostics: JSONObject | None = None
