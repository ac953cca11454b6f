"""A (query, document) pair for a cross-encoder, tokenized as its tokenizer tokenizes a pair (BERT:
`[CLS] a [SEP] b [SEP]`), and vLLM's rule for which texts pair up.

The token type ids (0 for the first text, 1 for the second) reach the model only where transformers'
tokenizer returns them: its `model_input_names` (tokenizer_config.json, else its class's) list
`token_type_ids`. A model that gets none reads every token as type 0, as it does under transformers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from openai_frontend.model.tokenizer import ModelTokenizer

# transformers' tokenizer classes whose model_input_names hold token_type_ids (the others' do not).
_TYPED_CLASSES = frozenset(
    {
        "Bert",
        "BertJapanese",
        "Electra",
        "ConvBert",
        "MobileBert",
        "SqueezeBert",
        "Funnel",
        "LayoutLM",
        "DebertaV2",
    }
)


@dataclass(frozen=True, slots=True)
class PairTokenizer:
    tokenizer: ModelTokenizer
    token_types: bool  # the model gets the pair's token type ids

    @classmethod
    def load(cls, tokenizer_dir: Path, tokenizer: ModelTokenizer) -> PairTokenizer:
        path = tokenizer_dir / "tokenizer_config.json"
        config = json.loads(path.read_text()) if path.is_file() else {}
        names = config.get("model_input_names")
        if isinstance(names, list):
            return cls(tokenizer, "token_type_ids" in names)
        name = str(config.get("tokenizer_class") or "").removesuffix("Fast").removesuffix("Tokenizer")
        return cls(tokenizer, name in _TYPED_CLASSES)

    def encode(self, text_1: str, text_2: str) -> tuple[list[int], list[int] | None]:
        """The pair's token ids (special tokens included: the tokenizer's template) and type ids."""
        encoding = self.tokenizer.tokenizer.encode(text_1, text_2, add_special_tokens=True)
        return list(encoding.ids), list(encoding.type_ids) if self.token_types else None


def cosine(a: list[float], b: list[float]) -> float:
    """How an embedding model scores a pair (vLLM's): the cosine of the two texts' embeddings."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)) or 1.0)


def score_pairs(data_1: str | Sequence[str], data_2: str | Sequence[str]) -> list[tuple[str, str]]:
    """vLLM's `score` pairs: one text against each of the others, or two lists pairwise."""
    first = [data_1] if isinstance(data_1, str) else list(data_1)
    second = [data_2] if isinstance(data_2, str) else list(data_2)
    if len(first) == 1:
        first = first * len(second)
    if not second or len(first) != len(second):
        raise ValueError(
            "score takes one text against a list, or two lists of one length: "
            f"got {len(first)} and {len(second)}"
        )
    return list(zip(first, second, strict=True))
