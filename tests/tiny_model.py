"""A small random-weight Llama with a real BPE tokenizer and chat template, saved like any hub model.

Tests load it back through `from_pretrained` (worker) and the tokenizer files (gateway), the same code
paths users take with a real model directory.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from openai_frontend.chatml import CHAT_TEMPLATE, EOS, IM_END, IM_START, SPECIAL_TOKENS


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


def build_tiny_model(path: Path, *, seed: int = 0, vocab_size: int = 512, max_len: int = 512) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=[IM_START, IM_END],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = max_len
    eos_id = tok.token_to_id(EOS)
    im_end_id = tok.token_to_id(IM_END)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_len,
        initializer_range=0.05,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=[eos_id, im_end_id], pad_token_id=eos_id
    )
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


if __name__ == "__main__":
    import sys

    print(build_tiny_model(Path(sys.argv[1] if len(sys.argv) > 1 else "models/tiny-llama")))
