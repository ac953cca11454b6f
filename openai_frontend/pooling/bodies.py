"""A pooling endpoint's body to the prompts it queues (token ids, and a pair's token types), and the
pooled results back to the endpoint's answer: OpenAI's embedding list (floats, or base64 of the
little-endian float32 bytes, the OpenAI SDK's default), the rerank results sorted by relevance, vLLM's
score list and classification list. A model serving embeddings but no scores reranks and scores by
the embeddings' cosine, as vLLM does."""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.protocol import PoolingEvent, PoolingParams, PoolingTask
from openai_frontend.generate.validation import check_model
from openai_frontend.model.served_model import ServedModel
from openai_frontend.pooling.inputs import EmbeddingTokenizer
from openai_frontend.pooling.labels import class_labels, label_of
from openai_frontend.pooling.pairs import PairTokenizer, cosine, score_pairs
from openai_frontend.pooling.schemas import ClassificationRequest, EmbeddingRequest, RerankRequest
from openai_frontend.protocol.errors import OpenAIError, invalid_request

Prompt = tuple[list[int], list[int] | None]  # token ids, token type ids


@dataclass(frozen=True, slots=True)
class PoolingJob:
    """What an endpoint queues: one request per prompt, all with `params`."""

    prompts: list[Prompt]
    params: PoolingParams
    user: str = ""


@functools.lru_cache(maxsize=8)
def _tokenizers(served: ServedModel) -> tuple[EmbeddingTokenizer, PairTokenizer]:
    root = Path(served.root)
    return EmbeddingTokenizer.load(root, served.tokenizer), PairTokenizer.load(root, served.tokenizer)


def embedding_job(body: EmbeddingRequest, served: ServedModel) -> PoolingJob:
    check_model(body.model, served)
    if body.dimensions is not None and body.dimensions < 1:
        raise invalid_request("dimensions must be at least 1", "dimensions")
    params = PoolingParams(
        dimensions=body.dimensions,
        normalize=body.normalize,
        truncate_prompt_tokens=body.truncate_prompt_tokens,
    )
    embedder, _ = _tokenizers(served)
    return PoolingJob(_prompts(body.input, served, embedder.encode), params, body.user or "")


def classification_job(body: ClassificationRequest, served: ServedModel) -> PoolingJob:
    """vLLM's `/classify`: each text tokenized as the classifier's tokenizer encodes one (its special
    tokens added), as transformers' pipeline reads it."""
    check_model(body.model, served)
    params = PoolingParams(
        task="classify", activation=body.activation, truncate_prompt_tokens=body.truncate_prompt_tokens
    )

    def encode(text: str) -> list[int]:
        return served.tokenizer.encode(text, add_special_tokens=True)

    return PoolingJob(_prompts(body.input, served, encode), params, body.user or "")


def pair_job(
    query: str | Sequence[str],
    documents: str | Sequence[str],
    served: ServedModel,
    task: PoolingTask,
    truncate: int | None,
) -> PoolingJob:
    """The pairs scored by a cross-encoder (task score), or the texts embedded (task embed: the query
    or text_1's texts first, then the documents)."""
    try:
        pairs = score_pairs(query, documents)
    except ValueError as exc:
        raise invalid_request(str(exc), "text_2") from None
    params = PoolingParams(task=task, truncate_prompt_tokens=truncate)
    embedder, pairer = _tokenizers(served)
    if task == "score":
        return PoolingJob([pairer.encode(a, b) for a, b in pairs], params)
    firsts = [query] if isinstance(query, str) else list(query)
    seconds = [documents] if isinstance(documents, str) else list(documents)
    return PoolingJob([(embedder.encode(text), None) for text in [*firsts, *seconds]], params)


def rerank_texts(body: RerankRequest, served: ServedModel) -> list[str]:
    check_model(body.model, served)
    if not body.documents:
        raise invalid_request("documents must not be empty", "documents")
    if body.top_n is not None and body.top_n < 0:
        raise invalid_request("top_n must be 0 (all) or more", "top_n")
    return [d if isinstance(d, str) else d.text for d in body.documents]


def scores(events: Sequence[PoolingEvent], task: PoolingTask, num_first: int) -> list[float]:
    """One score per pair: the model's (task score), else the cosine of the two texts' embeddings
    (the first `num_first` events are the first texts: one against all, or pairwise)."""
    if task == "score":
        return [e.values()[0] for e in events]
    firsts, seconds = events[:num_first], events[num_first:]
    if len(firsts) == 1:
        firsts = list(firsts) * len(seconds)
    return [cosine(a.values(), b.values()) for a, b in zip(firsts, seconds, strict=True)]


def embedding_answer(events: Sequence[PoolingEvent], encoding_format: str, model: str) -> dict[str, Any]:
    num_tokens = sum(e.num_prompt_tokens for e in events)
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(e.data).decode() if encoding_format == "base64" else e.values(),
            }
            for i, e in enumerate(events)
        ],
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def rerank_answer(
    req_id: str, texts: list[str], values: list[float], body: RerankRequest, model: str, num_tokens: int
) -> dict[str, Any]:
    order = sorted(range(len(values)), key=lambda i: values[i], reverse=True)
    if body.top_n:
        order = order[: body.top_n]
    results = [
        {
            "index": i,
            "document": {"text": texts[i]} if body.return_documents else None,
            "relevance_score": values[i],
        }
        for i in order
    ]
    return {
        "id": f"rerank-{req_id}",
        "model": model,
        "usage": {"total_tokens": num_tokens},
        "results": results,
    }


def score_answer(
    req_id: str, created: int, values: list[float], model: str, num_tokens: int
) -> dict[str, Any]:
    return {
        "id": f"score-{req_id}",
        "object": "list",
        "created": created,
        "model": model,
        "data": [{"index": i, "object": "score", "score": v} for i, v in enumerate(values)],
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def classification_answer(
    req_id: str, created: int, events: Sequence[PoolingEvent], model: str, model_dir: Path
) -> dict[str, Any]:
    """vLLM's `/classify` answer: per input its class probabilities and the likeliest class's label."""
    labels = class_labels(model_dir)
    data = []
    for i, e in enumerate(events):
        probs = e.values()
        best = max(range(len(probs)), key=probs.__getitem__)
        data.append({"index": i, "label": label_of(labels, best), "probs": probs, "num_classes": len(probs)})
    num_tokens = sum(e.num_prompt_tokens for e in events)
    return {
        "id": f"classify-{req_id}",
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def _prompts(
    given: str | list[str] | list[int] | list[list[int]],
    served: ServedModel,
    encode: Callable[[str], list[int]],
) -> list[Prompt]:
    """One prompt per input: a text, a list of texts, one list of token ids, or lists of them."""
    if isinstance(given, str):
        listed: list[str] | list[list[int]] = [given]
    elif given and isinstance(given[0], int):
        listed = [list(given)]
    else:
        listed = given  # type: ignore[assignment]
    if not listed:
        raise invalid_request("input must not be empty", "input")
    prompts: list[Prompt] = []
    for item in listed:
        ids = encode(item) if isinstance(item, str) else list(item)
        if not ids:
            raise invalid_request("an input must hold at least one token", "input")
        bad = [t for t in ids if not 0 <= t < served.tokenizer.vocab_size]
        if bad:
            raise OpenAIError(400, f"token id {bad[0]} is outside the vocabulary", param="input")
        prompts.append((ids, None))
    return prompts
