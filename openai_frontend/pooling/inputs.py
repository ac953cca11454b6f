"""An embedding input as token ids, tokenized as sentence-transformers tokenizes it for the same model.

sentence-transformers 6 reads a text as a chat message when its Transformer module lists the
`message` modality (`sentence_bert_config.json`'s `modality_config`, written when the tokenizer has
a chat template): the text becomes `[{"role": "user", "content": text}]` rendered by the chat template
(no generation prompt) and tokenized without adding special tokens, as `apply_chat_template` does.
Otherwise, and for models saved before that, the text is tokenized with the tokenizer's special
tokens. Token ids are taken as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from openai_frontend.model.chat_template import render_chat
from openai_frontend.model.tokenizer import ModelTokenizer

MessageFormat = Literal["flat", "structured"]


@dataclass(frozen=True, slots=True)
class EmbeddingTokenizer:
    tokenizer: ModelTokenizer
    message_format: MessageFormat | None  # texts become a user message in this format; None: plain

    @classmethod
    def load(cls, model_dir: Path, tokenizer: ModelTokenizer) -> EmbeddingTokenizer:
        return cls(tokenizer, message_format(model_dir) if tokenizer.chat_template else None)

    def encode(self, text: str) -> list[int]:
        template = self.tokenizer.chat_template
        if self.message_format is None or template is None:
            return self.tokenizer.encode(text, add_special_tokens=True)
        content: Any = text if self.message_format == "flat" else [{"type": "text", "text": text}]
        rendered = render_chat(
            template,
            [{"role": "user", "content": content}],
            special_tokens=self.tokenizer.special_tokens,
            add_generation_prompt=False,
        )
        return self.tokenizer.encode(rendered, add_special_tokens=False)


def transformer_dir(model_dir: Path) -> Path:
    """Where a sentence-transformers model's Transformer module (its tokenizer) is: `modules.json`'s
    path for it (the model's own folder since sentence-transformers 2, `0_Transformer` before)."""
    modules = _read_json(model_dir / "modules.json")
    for entry in modules if isinstance(modules, list) else []:
        if str(entry.get("type", "")).endswith("Transformer"):
            return model_dir / str(entry.get("path", ""))
    return model_dir


def message_format(model_dir: Path) -> MessageFormat | None:
    """The message format the model's Transformer module reads texts in; None: plain text."""
    config = _read_json(transformer_dir(model_dir) / "sentence_bert_config.json")
    modality = config.get("modality_config") if isinstance(config, dict) else None
    message = modality.get("message") if isinstance(modality, dict) else None
    if not isinstance(message, dict):
        return None
    return "structured" if message.get("format") == "structured" else "flat"


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else {}
