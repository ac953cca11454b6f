"""A small random-weight Llama with a real BPE tokenizer and chat template, saved like any hub model.

Tests load it back through `from_pretrained` (worker) and the tokenizer files (gateway), the same code
paths users take with a real model directory.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.workloads.chatml_tokenizer import (
    config_token_ids,
    fast_tokenizer,
    generation_config,
    train_tokenizer,
)

# Chat templates in model families' formats, on ChatML turns (tool calls, thoughts): `<name>.jinja`.
TEMPLATES = Path(__file__).resolve().parent / "templates"

# The tiny models' sizes (their configs' fields): the Llama here, the other families in family_models.py.
SMALL: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "initializer_range": 0.05,
    "tie_word_embeddings": False,
}

# The vision-language models' vision tower (LLaVA's CLIP, Gemma 3's SigLIP): images of 32 px in
# patches of 8.
VISION_TOWER: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 32,
    "patch_size": 8,
}


def byte_token_id(tokenizer: Any, byte: int) -> int:
    """The id of the token for one raw byte, spelled as byte-level BPE spells it (GPT-2's table:
    printable bytes as themselves, the others as chr(256 + their rank)). Used to make a request end on
    bytes that do not complete a UTF-8 character."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    char = chr(byte) if byte in printable else chr(256 + others.index(byte))
    token_id = tokenizer.token_to_id(char)
    assert token_id is not None
    return int(token_id)


def _corpus() -> list[str]:
    # Offline English text that every Python install carries: standard-library docstrings.
    import collections
    import json
    import os
    import textwrap

    lines: list[str] = []
    for module in (collections, json, os, textwrap, inspect):
        for _, obj in inspect.getmembers(module):
            doc = inspect.getdoc(obj)
            if doc:
                lines.extend(doc.splitlines())
    return lines


def build_tiny_model(
    path: Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    max_len: int = 512,
    chat_template: str | None = None,
    added_tokens: Sequence[str] = (),
) -> Path:
    """`chat_template` replaces the ChatML one (a family's format, harness/models/templates/);
    `added_tokens` become whole tokens that are not special (as Qwen3's `<think>`), so they stay in
    the text and a test can bias them."""
    import torch
    from tokenizers import AddedToken
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = train_tokenizer(_corpus(), vocab_size)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    fast = fast_tokenizer(tok, max_len)
    if chat_template is not None:
        fast.chat_template = chat_template

    torch.manual_seed(seed)
    sizes = {**SMALL, "vocab_size": tok.get_vocab_size(), "max_position_embeddings": max_len}
    config = LlamaConfig(**sizes, **config_token_ids(tok))
    model = LlamaForCausalLM(config)
    model.generation_config = generation_config(tok)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


if __name__ == "__main__":
    import sys

    print(build_tiny_model(Path(sys.argv[1] if len(sys.argv) > 1 else "models/tiny-llama")))
