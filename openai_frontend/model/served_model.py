"""What the front end knows about one model it serves: its rules, its tokenizer, its directory.

The rules are one record per model, built once from the operator's settings (gateway/model_setup.py)
and read by every request for it; a batch keeps them whole (BatchParams), so that the Celery task that
runs the batch's lines reads them by exactly the gateway's rules, with its own copy of the tokenizer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from openai_frontend.media.rules import MediaRules
from openai_frontend.model.tokenizer import ModelTokenizer

if TYPE_CHECKING:
    from openai_frontend.model.vision_processor import VisionProcessor


class ModelRules(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # what clients pass as `model`
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
    # The cells whose workers serve it (GATEWAY_MODELS_CONFIG); empty: the placing process's own
    # (a gateway's GATEWAY_CELLS or CBSERVE_CELL, a Celery worker's CBSERVE_CELL), as with one model.
    cells: tuple[str, ...] = ()
    # Images: how many, how large, which URLs are fetched (GATEWAY_LIMIT_MM_PER_PROMPT, ...).
    media: MediaRules = msgspec.field(default_factory=MediaRules)


@dataclass(slots=True, frozen=True)
class ServedModel:
    rules: ModelRules
    root: str  # model directory
    tokenizer: ModelTokenizer
    vision: VisionProcessor | None = None  # a vision-language model's processor; None: text only
    created: int = field(default_factory=lambda: int(time.time()))
