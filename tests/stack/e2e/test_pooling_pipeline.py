"""Pooling requests through the real pipeline: Redis, batchers and workers as processes, requests on
the requests stream and results read from each request's token stream.

The default cell's batcher schedules a generating worker (the tiny Llama) and a decoder embedding
worker (a sentence-transformers Qwen2, last-token pooling, its long prompts in chunks) side by side,
with generation running while the embeddings are computed; cells of their own serve a BERT embedder
and a BERT cross-encoder, and one gateway serves the chat model, the embedder and the cross-encoder
by name (GATEWAY_MODELS_CONFIG). Vectors match `SentenceTransformer.encode` and scores
`CrossEncoder.predict`, on the stream protocol and through the OpenAI SDK and the rerank and score routes.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from common.protocol import GenerateRequest, PoolingParams, SamplingParams
from common.stream_client import follow, new_req_id, submit, wait_pooled
from common.streams import DEFAULT_CELL
from common.token_rules import RequestFailed
from harness.models.pooling_models import (
    build_bert_embedder,
    build_cross_encoder,
    build_decoder_embedder,
    sentences,
)
from harness.processes.redis_server import free_port, redis_server
from harness.processes.services import Stack, wait_for
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.pooling.inputs import EmbeddingTokenizer
from openai_frontend.pooling.pairs import PairTokenizer

TEXTS = sentences(32)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pooling-models")
    build_bert_embedder(root / "bert")
    build_decoder_embedder(root / "qwen")
    build_cross_encoder(root / "cross-encoder")
    return root


@dataclass
class Pipeline:
    main: Stack  # the Redis, the default cell's batcher and its services
    url: str  # the one gateway of the chat model, the embedder and the cross-encoder


@pytest.fixture(scope="module")
def stacks(
    tmp_path_factory: pytest.TempPathFactory, models: Path, tiny_model_dir: Path
) -> Iterator[Pipeline]:
    """Its own Redis with the default cell's batcher and tiny Llama worker, and the pooling workers
    beside it (each a `Stack` of its own model on the same Redis), for the whole module."""
    log_dir = tmp_path_factory.mktemp("pooling-stack")
    with redis_server(log_dir) as url:
        main = Stack(url, tiny_model_dir, log_dir)
        others = [Stack(url, models / name, log_dir) for name in ("qwen", "bert", "cross-encoder")]
        try:
            qwen, bert, cross = others
            main.start_batcher()
            main.start_worker("worker-gen")
            qwen.start_worker("worker-qwen", WORKER_MAX_NUM_BATCHED_TOKENS="64", WORKER_MAX_NUM_SEQS="16")
            for cell, stack in (("bert", bert), ("ce", cross)):
                main.start_batcher(f"batcher-{cell}", CBSERVE_CELL=cell)
                stack.start_worker(f"worker-{cell}", CBSERVE_CELL=cell, WORKER_MAX_NUM_BATCHED_TOKENS="256")
            for cell, n in ((DEFAULT_CELL, 2), ("bert", 1), ("ce", 1)):
                joined = functools.partial(_joined, main, others, cell, n)
                wait_for(joined, 240, f"{n} workers in cell {cell}")
            # One gateway for the three models (docs/api.md, several models), each by its own cells.
            models_config = log_dir / "models.json"
            entries = [
                {"model": str(tiny_model_dir), "served_model_name": "chat", "cells": [DEFAULT_CELL]},
                {"model": str(models / "bert"), "served_model_name": "bert", "cells": ["bert"]},
                {"model": str(models / "cross-encoder"), "served_model_name": "ce", "cells": ["ce"]},
            ]
            models_config.write_text(json.dumps({"models": entries}))
            port = free_port()
            args = ["gateway", "--host", "127.0.0.1", "--port", str(port)]
            main._spawn("gateway", args, {"GATEWAY_MODELS_CONFIG": str(models_config)})
            main.base_url = f"http://127.0.0.1:{port}"
            wait_for(functools.partial(_healthy, main), 120, "the gateway")
            yield Pipeline(main, main.base_url)
        finally:
            for stack in (main, *others):
                stack.stop()


def _healthy(stack: Stack) -> bool:
    stack.check_alive()
    try:
        return httpx.get(f"{stack.base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _joined(main: Stack, others: list[Stack], cell: str, num_workers: int) -> bool:
    for stack in (main, *others):
        stack.check_alive()
    return main.num_workers_joined(cell) >= num_workers


def _pooling_request(
    cell: str, ids: list[int], params: PoolingParams, types: list[int] | None = None
) -> GenerateRequest:
    return GenerateRequest(
        req_id=new_req_id(cell),
        prompt_token_ids=ids,
        sampling_params=SamplingParams(),
        arrival_time=time.time(),
        pooling_params=params,
        token_type_ids=types,
    )


def _st_encode(model_dir: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    return np.stack([model.encode([text])[0] for text in TEXTS])  # one at a time: no padding


def test_embeddings_and_scores_through_redis_beside_generation(stacks: Pipeline, models: Path) -> None:
    from sentence_transformers import CrossEncoder

    embed = PoolingParams()
    requests = {}
    for name, cell in (("qwen", DEFAULT_CELL), ("bert", "bert")):
        tokenizer = EmbeddingTokenizer.load(models / name, ModelTokenizer(models / name))
        requests[name] = [_pooling_request(cell, tokenizer.encode(text), embed) for text in TEXTS]
    pairs = PairTokenizer.load(models / "cross-encoder", ModelTokenizer(models / "cross-encoder"))
    query, documents = TEXTS[5], TEXTS[:8]
    scored = []
    for document in documents:
        ids, types = pairs.encode(query, document)
        scored.append(_pooling_request("ce", ids, PoolingParams(task="score"), types))
    generations = [
        GenerateRequest(
            req_id=new_req_id(),
            prompt_token_ids=[1, *range(10 + i, 40 + i)],
            sampling_params=SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
            arrival_time=time.time(),
        )
        for i in range(4)
    ]
    with stacks.main.redis() as r, ThreadPoolExecutor(8) as pool:
        for request in generations:
            submit(r, request)
        for request in [*requests["qwen"], *requests["bert"], *scored]:
            submit(r, request)
        streamed = [pool.submit(lambda q=q: list(follow(r, q.req_id, timeout_s=300))) for q in generations]
        results = {
            name: [wait_pooled(r, q.req_id, timeout_s=300) for q in reqs] for name, reqs in requests.items()
        }
        scores = [wait_pooled(r, q.req_id, timeout_s=300).values()[0] for q in scored]
        tokens = [future.result() for future in streamed]
    assert [len(t) for t in tokens] == [24] * 4 and all(t[-1].finish_reason == "length" for t in tokens)
    for name, events in results.items():
        ours = np.array([e.values() for e in events])
        ref = _st_encode(models / name)
        cosine = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
        assert cosine.min() >= 0.99999, name
        assert [e.num_prompt_tokens for e in events] == [len(q.prompt_token_ids) for q in requests[name]]
    ref_scores = CrossEncoder(str(models / "cross-encoder"), device="cpu").predict(
        [(query, d) for d in documents]
    )
    assert np.allclose(scores, ref_scores, atol=1e-5)
    # The decoder's long prompts went in chunks (the batcher publishes its counts about once a second).
    wait_for(lambda: stacks.main.stats().get("num_partial_prefills", 0) > 0, 30, "chunked prefills counted")


def test_a_request_of_the_wrong_kind_fails_with_the_reason(stacks: Pipeline) -> None:
    with stacks.main.redis() as r:
        generate = GenerateRequest(
            req_id=new_req_id("bert"),
            prompt_token_ids=[2, 50, 3],
            sampling_params=SamplingParams(max_tokens=2),
            arrival_time=time.time(),
        )
        submit(r, generate)
        with pytest.raises(RequestFailed, match="is a pooling model"):
            list(follow(r, generate.req_id, timeout_s=60))
        scored = _pooling_request("bert", [2, 50, 3], PoolingParams(task="score"))
        submit(r, scored)
        with pytest.raises(RequestFailed, match="serves embed, not score"):
            wait_pooled(r, scored.req_id, timeout_s=60)


def test_embeddings_requests_sent_together_with_streaming_chat_match(stacks: Pipeline, models: Path) -> None:
    """32 `/v1/embeddings` requests at once (the SDK's defaults: base64) while the chat model streams."""
    client = openai.OpenAI(base_url=f"{stacks.url}/v1", api_key="unused", max_retries=0, timeout=300)

    def chat(prompt: str) -> int:
        stream = client.completions.create(model="chat", prompt=prompt, max_tokens=24, stream=True)
        return sum(1 for chunk in stream if chunk.choices and chunk.choices[0].text is not None)

    def embed(text: str) -> list[float]:
        return list(client.embeddings.create(model="bert", input=text).data[0].embedding)

    with ThreadPoolExecutor(16) as pool:
        chats = [pool.submit(chat, text) for text in TEXTS[:4]]
        vectors = list(pool.map(embed, TEXTS))
        assert all(future.result() > 0 for future in chats)
    ours, ref = np.array(vectors), _st_encode(models / "bert")
    assert ((ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)).min() >= 0.99999


def test_the_openai_sdks_embeddings_with_its_defaults_and_the_rerank_and_score_routes(
    stacks: Pipeline, models: Path
) -> None:
    from sentence_transformers import CrossEncoder

    client = openai.OpenAI(base_url=f"{stacks.url}/v1", api_key="unused", max_retries=0, timeout=120)
    texts = TEXTS[:8]
    reply = client.embeddings.create(model="bert", input=texts)  # base64 on the wire
    ours = np.array([d.embedding for d in reply.data])
    ref = _st_encode(models / "bert")[:8]
    assert ((ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)).min() >= 0.99999
    tokenizer = EmbeddingTokenizer.load(models / "bert", ModelTokenizer(models / "bert"))
    assert reply.usage.prompt_tokens == sum(len(tokenizer.encode(t)) for t in texts)
    long = " ".join(TEXTS)  # far over the BERT's 128 positions
    with pytest.raises(openai.BadRequestError, match="over max_model_len 128"):
        client.embeddings.create(model="bert", input=long)
    cut = client.embeddings.create(model="bert", input=long, extra_body={"truncate_prompt_tokens": 16})
    assert cut.usage.prompt_tokens == 16
    floats = client.embeddings.create(model="bert", input=[[2, 50, 3]], encoding_format="float")
    assert len(floats.data[0].embedding) == 32
    with pytest.raises(openai.BadRequestError, match="does not support matryoshka"):
        client.embeddings.create(model="bert", input="a", dimensions=8)
    with pytest.raises(openai.BadRequestError, match="is a pooling model"):
        client.completions.create(model="bert", prompt="hi", max_tokens=2)
    chat = client.completions.create(model="chat", prompt="The import statement", max_tokens=4)
    assert chat.usage is not None and chat.usage.completion_tokens == 4  # the chat model beside them

    query, documents = TEXTS[5], TEXTS[:6]
    ref_scores = CrossEncoder(str(models / "cross-encoder"), device="cpu").predict(
        [(query, d) for d in documents]
    )
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        body = {"model": "ce", "query": query, "documents": documents, "top_n": 3}
        answer = httpx.post(f"{stacks.url}{path}", json=body, timeout=120).json()
        assert [r["index"] for r in answer["results"]] == list(np.argsort(-ref_scores)[:3])
        assert [r["relevance_score"] for r in answer["results"]] == pytest.approx(
            sorted(ref_scores)[::-1][:3], abs=1e-5
        )
        assert answer["results"][0]["document"]["text"] == documents[answer["results"][0]["index"]]
    body = {"model": "ce", "text_1": query, "text_2": documents}
    answer = httpx.post(f"{stacks.url}/v1/score", json=body, timeout=120).json()
    assert [d["score"] for d in answer["data"]] == pytest.approx(list(ref_scores), abs=1e-5)

    # The reverse, a generation model asked for embeddings: tests/stack/clients/test_eval_harness.py (here the
    # chat model's cell holds a pooling worker too, so it takes embeddings).
