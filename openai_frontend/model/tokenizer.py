"""The model's tokenizer, loaded with the `tokenizers` library alone (transformers would import torch).

Reads what transformers would: tokenizer.json for the vocabulary, tokenizer_config.json for special tokens
and the chat template (or chat_template.jinja, which transformers 5 writes), generation_config.json and
config.json for EOS ids and the context length.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

# A list this short (the event loop decodes a few tokens per output token) is decoded holding the GIL:
# giving it up for microseconds could let another thread keep it for a switch interval (5 ms). A
# longer one (/detokenize's, decoded on a gateway thread) lets the event loop run while it decodes.
_DECODE_HOLDING_GIL = 4096
# Keys that hold the context length in config.json, across architectures.
_MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def read_json_object(path: Path) -> dict[str, Any]:
    """A model file's JSON object; {} when the file is missing or holds something else."""
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    # Special tokens are stored either as a plain string or as a serialized AddedToken dict.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _as_id_list(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def _load_chat_template(model_dir: Path, config: dict[str, Any]) -> str | None:
    # transformers prefers the standalone file when both exist.
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        default = named.get("default")
        return default if isinstance(default, str) else None
    return None


def read_max_model_len(model_dir: Path) -> int | None:
    """The context length config.json declares, or None when it declares none."""
    config = read_json_object(model_dir / "config.json")
    for section in (config, config.get("text_config") or {}):
        for key in _MAX_LEN_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


class ModelTokenizer:
    """Encode / decode plus the special tokens and chat template that go with them."""

    def __init__(self, model_dir: Path) -> None:
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config = read_json_object(model_dir / "tokenizer_config.json")
        # Variables the chat template may use, as transformers passes them.
        self.special_tokens: dict[str, str] = {}
        for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
            text = _token_text(config.get(name))
            if text is not None:
                self.special_tokens[name] = text
        self.chat_template = _load_chat_template(model_dir, config)
        self.eos_token_ids = self._eos_ids(model_dir)
        # Ids are validated against the tokenizer (what can be decoded), not the model's padded embedding.
        self.vocab_size = max(self.tokenizer.get_vocab(with_added_tokens=True).values()) + 1
        # Strings that encode() turns into control tokens; client text holding one is encoded by a copy
        # that reads them as plain text.
        added = self.tokenizer.get_added_tokens_decoder()
        # What decode(..., skip_special_tokens=True) leaves out (the detokenizer never holds them).
        self.special_token_ids = frozenset(i for i, t in added.items() if t.special)
        specials = sorted((t.content for t in added.values() if t.special), key=len, reverse=True)
        self._special_text = re.compile("|".join(map(re.escape, specials))) if specials else None
        self._plain = Tokenizer.from_str(self.tokenizer.to_str())
        self._plain.encode_special_tokens = True
        # What encode(add_special_tokens=True) puts around a text (e.g. BOS before it), found once.
        marked, plain = self.encode("a", add_special_tokens=True), self.encode("a", add_special_tokens=False)
        at = next((i for i in range(len(marked)) if marked[i : i + len(plain)] == plain), len(marked))
        self._special_prefix, self._special_suffix = marked[:at], marked[at + len(plain) :]

    def _eos_ids(self, model_dir: Path) -> list[int]:
        for name in ("generation_config.json", "config.json"):
            ids = _as_id_list(read_json_object(model_dir / name).get("eos_token_id"))
            if ids:
                return ids
        eos_text = self.special_tokens.get("eos_token")
        eos_id = self.tokenizer.token_to_id(eos_text) if eos_text else None
        return [eos_id] if eos_id is not None else []

    # The batch calls with one text: unlike `encode` they release the GIL while they work, so a gateway
    # thread tokenizing 3 MB (seconds) leaves the event loop running; the fast one skips the offsets
    # (half the time). The ids are the same.
    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids)

    def encode_plain(self, text: str) -> list[int]:
        """`text` as text: a special-token string inside it (e.g. "<|im_end|>") is not a control token."""
        return list(self._plain.encode_batch_fast([text], add_special_tokens=False)[0].ids)

    def has_special_text(self, text: str) -> bool:
        return self._special_text is not None and self._special_text.search(text) is not None

    def with_special_tokens(self, token_ids: list[int]) -> list[int]:
        """`token_ids` with the special tokens the tokenizer adds around a text (its BOS, say)."""
        return [*self._special_prefix, *token_ids, *self._special_suffix]

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        """Text of `token_ids` as clients see it: special tokens left out unless asked for."""
        if len(token_ids) < _DECODE_HOLDING_GIL:
            return str(self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))
        return str(self.tokenizer.decode_batch([token_ids], skip_special_tokens=skip_special_tokens)[0])
