"""What the front end knows about the one model it serves: name, tokenizer, context length, caps."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from openai_frontend.model.tokenizer import ModelTokenizer


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
    # The tool-call and reasoning formats (GATEWAY_TOOL_PARSER, GATEWAY_REASONING_PARSER): a name, none,
    # or auto (read from the chat template).
    tool_parser: str = "auto"
    reasoning_parser: str = "auto"
    # Other names a request may give: the model directory's path (openai_frontend/model/path_names.py),
    # unless the operator named the model (GATEWAY_SERVED_MODEL_NAME).
    path_names: frozenset[str] = frozenset()
    created: int = field(default_factory=lambda: int(time.time()))
