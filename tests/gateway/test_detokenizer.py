"""Incremental detokenization equals decoding the whole output, whatever the token boundaries."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from gateway.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def _stream(tokenizer: Tokenizer, prompt_ids: list[int], output_ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    return [detok.step(t) for t in output_ids]


@pytest.mark.parametrize(
    "text",
    [
        " Return the value of the object.",
        "line one\n  indented line two",
        " café naïve — “quoted” 日本語 🎉 done",
        "x",
    ],
)
def test_incremental_equals_full_decode(tokenizer: Tokenizer, text: str) -> None:
    prompt_ids = tokenizer.encode("The prompt ends here:").ids
    output_ids = tokenizer.encode(text).ids
    deltas = _stream(tokenizer, prompt_ids, output_ids)
    assert "".join(deltas) == tokenizer.decode(output_ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_split_multibyte_character_is_held_until_complete(tokenizer: Tokenizer) -> None:
    # The tiny byte-level vocabulary has no token for 🎉, so its four UTF-8 bytes are separate tokens.
    output_ids = tokenizer.encode("🎉").ids
    assert len(output_ids) > 1
    deltas = _stream(tokenizer, [], output_ids)
    assert deltas[:-1] == [""] * (len(output_ids) - 1)
    assert deltas[-1] == "🎉"


def test_special_tokens_are_skipped(tokenizer: Tokenizer) -> None:
    im_start, im_end = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
    assert im_start is not None and im_end is not None
    hello = tokenizer.encode("hello").ids
    deltas = _stream(tokenizer, [im_start], [*hello, im_end])
    assert "".join(deltas) == "hello"
    assert deltas[-1] == ""


def test_prompt_context_does_not_leak_into_output(tokenizer: Tokenizer) -> None:
    prompt_ids = tokenizer.encode("a long prompt with many tokens in it").ids
    output_ids = tokenizer.encode(" and more").ids
    assert "".join(_stream(tokenizer, prompt_ids, output_ids)) == " and more"
