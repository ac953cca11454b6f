"""`LLM(model, runner="pooling")`: embeddings, scores and classes through the pipeline's own scheduler
and runners match sentence-transformers' (and transformers') for tiny random models built with their
own classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cbserve import LLM
from common.protocol import PoolingParams
from harness.models.pooling_models import (
    build_bert_embedder,
    build_cross_encoder,
    build_decoder_embedder,
    build_decoder_reranker,
    sentences,
)

TEXTS = sentences(32)
# A small step budget and batch: long prompts of the causal model go in chunks, many steps mixed.
SMALL_STEPS: dict[str, Any] = {"max_num_batched_tokens": 32, "max_num_seqs": 8, "num_blocks": 256}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pooling-models")
    build_bert_embedder(root / "bert-mean")
    build_bert_embedder(root / "xlm-roberta-cls", pooling="cls", arch="xlm-roberta")
    build_bert_embedder(root / "modernbert-mean", arch="modernbert")
    build_decoder_embedder(root / "qwen-last")
    build_decoder_embedder(root / "qwen-mean", pooling="mean")
    build_cross_encoder(root / "cross-encoder")
    build_decoder_reranker(root / "reranker")
    return root


def cosines(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)


def st_encode(model_dir: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    # One at a time: a batch pads, and a decoder's left padding would move its positions.
    model = SentenceTransformer(str(model_dir), device="cpu")
    return np.stack([model.encode([text])[0] for text in texts])


@pytest.mark.parametrize(
    ("name", "steps"),
    [
        ("bert-mean", {"max_num_batched_tokens": 256}),
        ("xlm-roberta-cls", {"max_num_batched_tokens": 256}),
        ("modernbert-mean", {"max_num_batched_tokens": 256}),
        ("qwen-last", SMALL_STEPS),
        ("qwen-mean", SMALL_STEPS),
    ],
)
def test_embeddings_match_sentence_transformers(models: Path, name: str, steps: dict[str, Any]) -> None:
    llm = LLM(str(models / name), runner="pooling", device="cpu", enforce_eager=True, **steps)
    outputs = llm.embed(TEXTS, use_tqdm=False)
    ours = np.array([out.outputs.embedding for out in outputs])
    assert cosines(ours, st_encode(models / name, TEXTS)).min() >= 0.99999
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # its Normalize module
    if name.startswith("qwen"):
        assert llm.llm_engine.stats.num_partial_prefills > 0  # some prompts went in chunks


def test_a_last_token_embedding_reuses_a_cached_prefix_and_computes_its_last_token(models: Path) -> None:
    llm = LLM(str(models / "qwen-last"), runner="pooling", device="cpu", enforce_eager=True, block_size=4)
    first = llm.embed(TEXTS[3], use_tqdm=False)[0]
    again = llm.embed(TEXTS[3], use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens > 0
    assert np.allclose(first.outputs.embedding, again.outputs.embedding, atol=1e-6)


def test_cross_encoder_scores_match_cross_encoder_predict(models: Path) -> None:
    from sentence_transformers import CrossEncoder

    query, documents = TEXTS[5], TEXTS[:8]
    llm = LLM(str(models / "cross-encoder"), runner="pooling", device="cpu", enforce_eager=True)
    ours = np.array([out.outputs.score for out in llm.score(query, documents, use_tqdm=False)])
    ref = CrossEncoder(str(models / "cross-encoder"), device="cpu").predict([(query, d) for d in documents])
    assert np.allclose(ours, ref, atol=1e-5)
    assert list(np.argsort(-ours)) == list(np.argsort(-ref))
    classes = llm.classify(TEXTS[:2], use_tqdm=False)
    assert [out.outputs.num_classes for out in classes] == [1, 1]


def test_a_decoder_reranker_scores_with_two_tokens_logits(models: Path) -> None:
    path = models / "reranker"
    llm = LLM(
        str(path),
        runner="pooling",
        device="cpu",
        enforce_eager=True,
        hf_overrides={"classifier_from_token": ["no", "yes"]},
    )
    query, documents = "<Query>: " + TEXTS[5], ["<Document>: " + d for d in TEXTS[:4]]
    ours = [out.outputs.score for out in llm.score(query, documents, use_tqdm=False)]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    no, yes = tokenizer.convert_tokens_to_ids(["no", "yes"])
    with torch.no_grad():
        for document, score in zip(documents, ours, strict=True):
            logits = model(torch.tensor([tokenizer(query, document)["input_ids"]])).logits[0, -1]
            assert score == pytest.approx(torch.softmax(logits[[no, yes]], -1)[1].item(), abs=1e-6)


def test_what_a_model_does_not_serve_is_refused_by_name(models: Path, tiny_model_dir: Path) -> None:
    llm = LLM(str(models / "bert-mean"), runner="pooling", device="cpu", enforce_eager=True)
    with pytest.raises(ValueError, match="is a pooling model"):
        llm.generate("hello")
    with pytest.raises(ValueError, match="serves embed, not score"):
        llm.encode("hello", pooling_task="score")
    with pytest.raises(RuntimeError, match="does not support matryoshka representation"):
        llm.embed("hello", pooling_params=PoolingParams(dimensions=8), use_tqdm=False)
    chat = LLM(str(tiny_model_dir), device="cpu", enforce_eager=True)
    with pytest.raises(ValueError, match=r"serves generation \(runner generate\), not embed"):
        chat.embed("hello")


def test_matryoshka_dimensions_cut_then_normalize(models: Path) -> None:
    llm = LLM(
        str(models / "bert-mean"),
        runner="pooling",
        device="cpu",
        enforce_eager=True,
        hf_overrides={"is_matryoshka": True},
    )
    full = np.array(llm.embed(TEXTS[0], use_tqdm=False)[0].outputs.embedding)
    cut = llm.embed(TEXTS[0], pooling_params=PoolingParams(dimensions=8), use_tqdm=False)[0]
    assert cut.outputs.hidden_size == 8
    assert np.allclose(cut.outputs.embedding, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)


def test_an_embedding_models_score_is_the_cosine_of_its_embeddings(models: Path) -> None:
    llm = LLM(str(models / "bert-mean"), runner="pooling", device="cpu", enforce_eager=True)
    (score,) = llm.score(TEXTS[0], [TEXTS[1]], use_tqdm=False)
    a, b = (np.array(out.outputs.embedding) for out in llm.embed(TEXTS[:2], use_tqdm=False))
    assert score.outputs.score == pytest.approx(float(a @ b), abs=1e-5)
