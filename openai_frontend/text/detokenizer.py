"""Incremental detokenization, vLLM-style: decode a short window of tokens and emit what it added.

Decoding one token at a time is wrong for many tokenizers (SentencePiece drops the leading space of the
first token; byte-level BPE splits multi-byte characters across tokens), so each step decodes the tokens
from `prefix_offset` and emits only the text beyond what `prefix_offset:read_offset` already produced.
The window is walked by tokenizers' own `DecodeStream` (the same algorithm in Rust, one call a token:
vLLM's FastIncrementalDetokenizer); the offsets are mirrored here for `flush`, and a stream that
refuses a step (its new text does not extend the last, which some normalizers cause) hands the rest
of the request to the same window decoded from Python.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from openai_frontend.model.tokenizer import ModelTokenizer

# Prompt tokens kept as left context so the first output token decodes with the right leading space.
NUM_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: ModelTokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer: Tokenizer = tokenizer.tokenizer
        self._skip_special_tokens = skip_special_tokens  # false: special tokens show (vLLM's option)
        self._skipped = tokenizer.special_token_ids if skip_special_tokens else frozenset()
        self._token_ids = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        # Text up to read_offset has been emitted; prefix_offset:read_offset is the context window.
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)
        # The stream takes its context's text as emitted only when that text is whole: a context that
        # ends mid-character is walked by the Python window, as every token was before.
        clean = not self._decode(0).endswith(_REPLACEMENT_CHAR)
        self._stream: DecodeStream | None = (
            DecodeStream(self._token_ids, skip_special_tokens) if clean else None
        )

    def _decode(self, start: int, end: int | None = None) -> str:
        return str(
            self._tokenizer.decode(self._token_ids[start:end], skip_special_tokens=self._skip_special_tokens)
        )

    def step(self, token_id: int) -> str:
        """Append one token and return the new text it completes (often "", e.g. mid-character)."""
        if token_id in self._skipped:
            # Decoding drops it before anything else, so the window never holds it: a run of them (a
            # model that emits EOS with ignore_eos) would otherwise grow the window, and each decode.
            return ""
        self._token_ids.append(token_id)
        if self._stream is not None:
            try:
                text = self._stream.step(self._tokenizer, token_id)
            except Exception:  # tokenizers raises a plain Exception on a prefix it cannot extend
                self._stream = None
            else:
                if text is None:
                    return ""
                self._advance()
                return str(text)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        # A trailing U+FFFD is an incomplete UTF-8 sequence: wait for the next token to finish it.
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return ""
        self._advance()
        return new_text[len(prefix_text) :]

    def _advance(self) -> None:
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)

    def flush(self) -> str:
        """The text still held back, at the end of the output: bytes that never completed a character
        come out as U+FFFD, as `decode(token_ids)` gives them, so the text always equals the decode."""
        if self._read_offset == len(self._token_ids):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        self._prefix_offset = self._read_offset = len(self._token_ids)
        return new_text[len(prefix_text) :]
