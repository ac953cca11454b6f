"""vLLM's tokenizer endpoints' bodies: `POST /tokenize` (a prompt, or chat messages as the chat
endpoint renders them), `POST /detokenize`, and the answers. Strict, as the generation bodies are."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from openai_frontend.protocol.openai_schemas import ChatMessage
from openai_frontend.protocol.strings import Id, JSONObject, Text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TokenizeCompletionRequest(_Strict):
    model: Id | None = None
    prompt: Text
    add_special_tokens: bool | None = True  # the tokenizer's own (a BOS, say), as a completion adds
    return_token_strs: bool | None = False  # also each token as the tokenizer spells it


class TokenizeChatRequest(_Strict):
    model: Id | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    add_special_tokens: bool | None = False  # the template writes its own
    return_token_strs: bool | None = False
    chat_template_kwargs: JSONObject | None = None
    tools: list[JSONObject] | None = None  # listed in the prompt, as the chat endpoint lists them


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Strict):
    model: Id | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
