"""Incremental detokenization equals decoding the whole output, whatever the token boundaries."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from harness.models.tiny_model import byte_token_id
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.text.detokenizer import NUM_CONTEXT_TOKENS, IncrementalDetokenizer
from openai_frontend.text.output_processor import OutputProcessor


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> ModelTokenizer:
    return ModelTokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def tokenizer(served: ModelTokenizer) -> Tokenizer:
    return served.tokenizer


def _stream(tokenizer: ModelTokenizer, prompt_ids: list[int], output_ids: list[int]) -> list[str]:
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
def test_incremental_equals_full_decode(tokenizer: Tokenizer, text: str, served: ModelTokenizer) -> None:
    prompt_ids = tokenizer.encode("The prompt ends here:").ids
    output_ids = tokenizer.encode(text).ids
    deltas = _stream(served, prompt_ids, output_ids)
    assert "".join(deltas) == tokenizer.decode(output_ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_split_multibyte_character_is_held_until_complete(
    tokenizer: Tokenizer, served: ModelTokenizer
) -> None:
    # The tiny byte-level vocabulary has no token for 🎉, so its four UTF-8 bytes are separate tokens.
    output_ids = tokenizer.encode("🎉").ids
    assert len(output_ids) > 1
    deltas = _stream(served, [], output_ids)
    assert deltas[:-1] == [""] * (len(output_ids) - 1)
    assert deltas[-1] == "🎉"


def test_special_tokens_are_skipped(tokenizer: Tokenizer, served: ModelTokenizer) -> None:
    im_start, im_end = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
    assert im_start is not None and im_end is not None
    hello = tokenizer.encode("hello").ids
    deltas = _stream(served, [im_start], [*hello, im_end])
    assert "".join(deltas) == "hello"
    assert deltas[-1] == ""


def test_prompt_context_does_not_leak_into_output(tokenizer: Tokenizer, served: ModelTokenizer) -> None:
    prompt_ids = tokenizer.encode("a long prompt with many tokens in it").ids
    output_ids = tokenizer.encode(" and more").ids
    assert "".join(_stream(served, prompt_ids, output_ids)) == " and more"


@pytest.mark.parametrize("tail", [[0xE2], [0xE2] * 5, [0xF0, 0x9F, 0x8E], [0xE2, 0xE2, 0x82]])
def test_flush_releases_bytes_that_never_complete_a_character(
    tokenizer: Tokenizer, tail: list[int], served: ModelTokenizer
) -> None:
    output_ids = tokenizer.encode(" ok").ids + [byte_token_id(tokenizer, b) for b in tail]
    detok = IncrementalDetokenizer(served, tokenizer.encode("The prompt").ids)
    deltas = [detok.step(t) for t in output_ids]
    assert "".join(deltas) == " ok"  # held back while a later token might still complete them
    deltas.append(detok.flush())
    assert "".join(deltas) == tokenizer.decode(output_ids)
    assert deltas[-1].startswith("\ufffd")
    assert detok.flush() == ""


@pytest.mark.parametrize("finish_reason", ["length", "stop"])
def test_output_text_equals_the_decode_when_it_ends_mid_character(
    tokenizer: Tokenizer, finish_reason: str, served: ModelTokenizer
) -> None:
    """The last delta carries the held-back bytes, whether the output ran out or an EOS ended it."""
    output_ids = [*tokenizer.encode(" done").ids, *(byte_token_id(tokenizer, 0xE2) for _ in range(3))]
    eos = tokenizer.token_to_id("<|endoftext|>")
    if finish_reason == "stop":
        output_ids.append(eos)
    processor = OutputProcessor(served, tokenizer.encode("The prompt").ids, stop=[])
    deltas = [processor.process(t, None) for t in output_ids[:-1]]
    deltas.append(processor.process(output_ids[-1], finish_reason))
    assert deltas[-1].finish_reason == finish_reason
    text = "".join(d.text for d in deltas)
    assert text == processor.text == tokenizer.decode(output_ids, skip_special_tokens=True)
    assert text.endswith("\ufffd" * 3)


def test_flush_adds_nothing_after_a_stop_string(tokenizer: Tokenizer, served: ModelTokenizer) -> None:
    output_ids = [*tokenizer.encode(" one two").ids, byte_token_id(tokenizer, 0xE2)]
    processor = OutputProcessor(served, [], stop=["two"])
    deltas = [processor.process(t, None) for t in output_ids]
    assert "".join(d.text for d in deltas) == " one "
    assert any(d.stop_string_hit for d in deltas)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_rust_stream_emits_what_the_window_decode_emits(
    tokenizer: Tokenizer, skip_special_tokens: bool, served: ModelTokenizer
) -> None:
    """tokenizers' DecodeStream walks the same window as the Python decode it replaced, delta for
    delta, over random tokens: special ones, lone bytes of multi-byte characters and words."""
    rng = random.Random(0)
    vocab = tokenizer.get_vocab_size()
    for _ in range(200):
        prompt_ids = [rng.randrange(vocab) for _ in range(rng.randrange(0, 9))]
        output_ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        fast = IncrementalDetokenizer(served, prompt_ids, skip_special_tokens)
        window = IncrementalDetokenizer(served, prompt_ids, skip_special_tokens)
        window._stream = None  # the Python window decode, which a refusing stream falls back to
        assert [fast.step(t) for t in output_ids] == [window.step(t) for t in output_ids]
        assert fast.flush() == window.flush()


def test_skipped_special_tokens_never_widen_the_window(tokenizer: Tokenizer, served: ModelTokenizer) -> None:
    """A model that emits EOS over and over (ignore_eos) must not make each step decode all of them."""
    eos = tokenizer.token_to_id("<|endoftext|>")
    hello = tokenizer.encode(" hello").ids
    output_ids = [*hello, *[eos] * 500, *hello]
    detok = IncrementalDetokenizer(served, tokenizer.encode("The prompt").ids)
    assert "".join(detok.step(t) for t in output_ids) == " hello hello"
    assert len(detok._token_ids) <= NUM_CONTEXT_TOKENS + 2 * len(hello)
