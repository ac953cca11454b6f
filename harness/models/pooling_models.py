"""Tiny random pooling models saved as their users save them: sentence-transformers embedders (a BERT
with mean pooling and Normalize, a Qwen2 decoder with last-token pooling), a BERT CrossEncoder, a BERT
classifier of three labels, and a Qwen2 causal LM to serve as a decoder reranker (classifier_from_token
"no"/"yes").

Each is built with sentence-transformers' own classes (or transformers') and saved with `.save()` /
`save_pretrained`, so the worker reads the same files (`modules.json`, `1_Pooling/config.json`,
`config_sentence_transformers.json`) a hub model has.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from benchmarks.workloads.chatml_tokenizer import config_token_ids, fast_tokenizer, train_tokenizer
from harness.models.tiny_model import _corpus

BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXTS = [
    "The cat sat on the mat.",
    "Return a new dictionary with the keys of the mapping.",
    "Split the pathname path into a pair.",
    "A paged KV cache holds every running request's keys and values.",
    "Embeddings and reranking for retrieval-augmented generation.",
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
    "Dedent any common leading whitespace from every line in text.",
]


def sentences(n: int) -> list[str]:
    """`n` inputs of different lengths and words: the test texts and lines of the corpus."""
    corpus = [line.strip() for line in _corpus() if len(line.strip()) > 20]
    out = list(TEXTS)
    for i, line in enumerate(corpus[: max(0, n - len(out))]):
        out.append(" ".join([line] * (1 + i % 3)))  # some several times longer
    return out[:n]


def _bert_tokenizer(max_len: int) -> Any:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_wordpiece()),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_len,
    )


@functools.cache
def _trained_wordpiece() -> str:
    """A BERT-style WordPiece tokenizer trained on the corpus, as JSON (trained once per process)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=BERT_SPECIAL, show_progress=False)
    tok.train_from_iterator([*_corpus(), *TEXTS], trainer=trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return str(tok.to_str())


@functools.cache
def _trained_bpe() -> str:
    """The ChatML byte-level BPE of the tiny generation model, as JSON (trained once per process)."""
    return str(train_tokenizer(_corpus(), 512).to_str())


def _bpe() -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(_trained_bpe())


# The tiny models' shape; a benchmark passes larger `sizes` (benchmarks/baselines/embed_throughput.py).
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}


def _bert_config(tokenizer: Any, max_len: int, sizes: dict[str, int] | None = None, **kw: Any) -> Any:
    from transformers import BertConfig

    shape: dict[str, Any] = dict(sizes or TINY)  # typed loosely: the config's keywords differ in type
    return BertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_len,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
        **kw,
    )


def build_bert_embedder(
    path: Path,
    *,
    pooling: str = "mean",
    normalize: bool = True,
    seed: int = 0,
    arch: str = "bert",
    sizes: dict[str, int] | None = None,
    max_len: int = 128,
) -> Path:
    """A sentence-transformers model: an encoder (`arch`: bert, xlm-roberta or modernbert), then
    Pooling(`pooling`), then Normalize."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    tokenizer = _bert_tokenizer(max_len)
    torch.manual_seed(seed)
    raw = path.parent / f"{path.name}-transformers"
    _encoder(arch, tokenizer, max_len, sizes).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    transformer = Transformer(str(raw))
    modules: list[Any] = [transformer, Pooling(transformer.get_embedding_dimension(), pooling)]
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules).save(str(path))
    return path


def _encoder(arch: str, tokenizer: Any, max_len: int, sizes: dict[str, int] | None) -> Any:
    from transformers import BertModel, ModernBertConfig, ModernBertModel, XLMRobertaConfig, XLMRobertaModel

    if arch == "bert":
        return BertModel(_bert_config(tokenizer, max_len, sizes))
    shape = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id, **(sizes or TINY)}
    if arch == "xlm-roberta":
        # Positions start after the padding index, as RoBERTa's do: 130 of them hold 128 tokens and more.
        return XLMRobertaModel(
            XLMRobertaConfig(max_position_embeddings=max_len + 2, type_vocab_size=1, **shape)
        )
    ids = {"cls_token_id": tokenizer.cls_token_id, "sep_token_id": tokenizer.sep_token_id}
    ids |= {"bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id}
    return ModernBertModel(ModernBertConfig(max_position_embeddings=max_len, **shape, **ids))


def build_decoder_embedder(
    path: Path, *, pooling: str = "lasttoken", seed: int = 0, sizes: dict[str, int] | None = None
) -> Path:
    """A sentence-transformers model over a headless Qwen2 (Qwen3-Embedding / gte-Qwen2's shape)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import Qwen2Model

    raw = path.parent / f"{path.name}-transformers"
    tok = _bpe()
    torch.manual_seed(seed)
    Qwen2Model(_qwen2_config(tok, sizes)).save_pretrained(raw)
    fast_tokenizer(tok, 512).save_pretrained(raw)
    transformer = Transformer(str(raw))
    pool = Pooling(transformer.get_embedding_dimension(), pooling)
    SentenceTransformer(modules=[transformer, pool, Normalize()]).save(str(path))
    return path


def build_cross_encoder(path: Path, *, seed: int = 0) -> Path:
    """A sentence-transformers CrossEncoder over BertForSequenceClassification with one label."""
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import BertForSequenceClassification

    max_len = 128
    tokenizer = _bert_tokenizer(max_len)
    torch.manual_seed(seed)
    raw = path.parent / f"{path.name}-transformers"
    config = _bert_config(tokenizer, max_len, num_labels=1, initializer_range=0.5)  # scores far apart
    BertForSequenceClassification(config).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    CrossEncoder(str(raw)).save(str(path))
    return path


def build_classifier(path: Path, *, labels: tuple[str, ...] = ("negative", "neutral", "positive")) -> Path:
    """A BertForSequenceClassification over several named labels, saved as transformers saves it: what
    vLLM's `/classify` serves (the names in config.json's `id2label`)."""
    import torch
    from transformers import BertForSequenceClassification

    tokenizer = _bert_tokenizer(128)
    torch.manual_seed(0)
    names = dict(enumerate(labels))
    config = _bert_config(
        tokenizer, 128, id2label=names, label2id={v: k for k, v in names.items()}, initializer_range=0.5
    )
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_decoder_reranker(path: Path, *, seed: int = 0) -> Path:
    """A Qwen2 causal LM whose tokenizer has "yes" and "no" tokens (Qwen3-Reranker's shape)."""
    import torch
    from tokenizers import AddedToken
    from transformers import Qwen2ForCausalLM

    tok = _bpe()
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("yes", "no")])
    torch.manual_seed(seed)
    Qwen2ForCausalLM(_qwen2_config(tok)).save_pretrained(path)
    fast_tokenizer(tok, 512).save_pretrained(path)
    return path


def _qwen2_config(tok: Any, sizes: dict[str, int] | None = None) -> Any:
    from transformers import Qwen2Config

    shape: dict[str, Any] = sizes or {**TINY, "hidden_size": 64, "intermediate_size": 128}
    return Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        num_key_value_heads=shape["num_attention_heads"] // 2,
        max_position_embeddings=512,
        **shape,
        initializer_range=0.05,
        tie_word_embeddings=False,
        **config_token_ids(tok),
    )
