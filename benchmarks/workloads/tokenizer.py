"""The model's tokenizer.json through the `tokenizers` library (no transformers, no torch)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class BenchTokenizer:
    """Encode, decode and the ids a random prompt may use (the vocabulary without special tokens)."""

    def __init__(self, model_dir: str | Path) -> None:
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; --model must be a directory with a tokenizer.json")
        self.tokenizer = Tokenizer.from_file(str(path))
        self.special_ids = frozenset(
            token_id for token_id, added in self.tokenizer.get_added_tokens_decoder().items() if added.special
        )
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1

    def sampleable_ids(self) -> list[int]:
        """Ids a random prompt draws from: every vocabulary id that is not a special token, sorted."""
        vocab = self.tokenizer.get_vocab(with_added_tokens=False)
        return sorted(i for i in set(vocab.values()) if i not in self.special_ids)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def text_prompt(self, token_ids: list[int], max_rounds: int = 8) -> tuple[str, int]:
        """Text that re-encodes to about `len(token_ids)` tokens, and its re-encoded length.

        Random ids rarely survive decode -> encode unchanged (merges differ at the seams), so the
        re-encoded ids are cut to the target length and decoded again, as vLLM's random dataset does,
        until the text no longer encodes longer than the target (or `max_rounds` is spent).
        """
        target = len(token_ids)
        text = self.decode(token_ids)
        ids = self.encode(text)
        for _ in range(max_rounds):
            if len(ids) <= target:
                break
            text = self.decode(ids[:target])
            ids = self.encode(text)
        return text, len(ids)


class IncrementalDecoder:
    """Text deltas of a growing token list (vLLM's prefix / read offsets), without re-decoding it all.

    Only the last few tokens are decoded per step; a delta that ends in an incomplete UTF-8 sequence
    (U+FFFD) is held back until the next token completes it.
    """

    def __init__(self, tokenizer: BenchTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        if len(text) <= len(prefix) or text.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return text[len(prefix) :]
