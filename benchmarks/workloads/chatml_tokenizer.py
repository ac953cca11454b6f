"""The byte-level BPE tokenizer with ChatML special tokens that every locally built model ships.

The benchmark models (benchmarks/workloads/make_model.py), the test suite's models
(harness/models/tiny_model.py, and the vision-language ones of harness/models/vision.py) and the demo
model (scripts/train_demo_model.py) train it on their own text and wrap it the same way, so the
gateway reads each of them like a hub model's tokenizer files.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TypedDict

from openai_frontend.model.chatml import CHAT_TEMPLATE, EOS, IM_END, IM_START, SPECIAL_TOKENS

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, PreTrainedTokenizerFast


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of `vocab_size` tokens (the special tokens first) trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def fast_tokenizer(
    tok: Tokenizer,
    max_len: int,
    chat_template: str = CHAT_TEMPLATE,
    model_specific_special_tokens: dict[str, str] | None = None,
) -> PreTrainedTokenizerFast:
    """`tok` as transformers saves and loads it: EOS doubles as BOS and padding, ChatML template (or a
    family's own, with the tokens its processor reads as the tokenizer's attributes, e.g. image_token)."""
    from transformers import PreTrainedTokenizerFast

    # Passed only when given: transformers saves any keyword it gets, None too, in tokenizer_config.json.
    family_tokens = (
        {"model_specific_special_tokens": model_specific_special_tokens}
        if model_specific_special_tokens
        else {}
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=EOS,
        extra_special_tokens=[IM_START, IM_END],
        **family_tokens,
    )
    fast.chat_template = chat_template
    fast.model_max_length = max_len
    return fast


class ConfigTokenIds(TypedDict):
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int


def config_token_ids(tok: Tokenizer) -> ConfigTokenIds:
    """The model config's special token ids: EOS doubles as BOS and padding."""
    eos_id = _token_id(tok, EOS)
    return {"bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id}


def generation_config(tok: Tokenizer) -> GenerationConfig:
    """Generation ends at EOS or at the end of a chat turn."""
    from transformers import GenerationConfig

    eos_id = _token_id(tok, EOS)
    return GenerationConfig(
        bos_token_id=eos_id, eos_token_id=[eos_id, _token_id(tok, IM_END)], pad_token_id=eos_id
    )


def _token_id(tok: Tokenizer, token: str) -> int:
    token_id = tok.token_to_id(token)
    assert token_id is not None, f"{token} is not in the vocabulary"
    return int(token_id)
