"""What the gateway knows about the one model it serves: name, tokenizer, context length."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway.chat_template import check_template
from gateway.settings import GatewaySettings
from gateway.tokenizer import ModelTokenizer, read_max_model_len


@dataclass(slots=True, frozen=True)
class ServedModel:
    name: str  # what clients pass as `model`
    root: str  # model directory
    tokenizer: ModelTokenizer
    max_model_len: int  # longest prompt + output
    max_prompt_tokens: int | None = None  # operator's cap on prompts (GATEWAY_MAX_PROMPT_TOKENS)
    max_tokens: int | None = None  # operator's cap on max_tokens, also its default (GATEWAY_MAX_TOKENS)
    # Special-token strings in chat messages become control tokens (GATEWAY_CHAT_CONTENT_SPECIAL_TOKENS).
    special_tokens_in_content: bool = False
    created: int = field(default_factory=lambda: int(time.time()))


def load_served_model(settings: GatewaySettings) -> ServedModel:
    tokenizer = ModelTokenizer(settings.model)
    if tokenizer.chat_template is not None:
        check_template(tokenizer.chat_template)
    max_model_len = settings.max_model_len or read_max_model_len(settings.model)
    if max_model_len is None:
        raise ValueError(
            f"{settings.model}/config.json declares no context length; set GATEWAY_MAX_MODEL_LEN"
        )
    return ServedModel(
        name=settings.model_name,
        root=str(settings.model),
        tokenizer=tokenizer,
        max_model_len=max_model_len,
        max_prompt_tokens=settings.max_prompt_tokens,
        max_tokens=settings.max_tokens,
        special_tokens_in_content=settings.chat_content_special_tokens,
    )
