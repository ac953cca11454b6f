"""Pooling requests through the real pipeline: Redis, batchers and workers as processes, requests on
the requests stream and results read from each request's token stream.

The default cell's batcher schedules a generating worker (the tiny Llama) and a decoder embedding
worker (a sentence-transformers Qwen2, last-token pooling, its long prompts in chunks) side by side,
with generation running while the embeddings are computed; cells of their own serve a BERT embedder
and a BERT cross-encoder. Vectors match `SentenceTransformer.encode` and scores `CrossEncoder.predict`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from common.protocol import GenerateRequest, PoolingParams, SamplingParams
from common.stream_client import follow, new_req_id, submit, wait_pooled
from common.streams import DEFAULT_CELL
from common.token_rules import RequestFailed
from harness.pooling_models import build_bert_embedder, build_cross_encoder, build_decoder_embedder, sentences
from harness.redis_server import redis_server
from harness.services import Stack, wait_for
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


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory, models: Path, tiny_model_dir: Path) -> Iterator[Stack]:
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
                wait_for(
                    lambda c=cell, k=n: _joined(main, others, c) >= k, 240, f"{n} workers in cell {cell}"
                )  # type: ignore[misc]
            yield main
        finally:
            for stack in (main, *others):
                stack.stop()


def _joined(main: Stack, others: list[Stack], cell: str) -> int:
    for stack in (main, *others):
        stack.check_alive()
    return main.num_workers_joined(cell)


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


def test_embeddings_and_scores_through_redis_beside_generation(stacks: Stack, models: Path) -> None:
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
    with stacks.redis() as r, ThreadPoolExecutor(8) as pool:
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
    wait_for(lambda: stacks.stats().get("num_partial_prefills", 0) > 0, 30, "chunked prefills counted")


def test_a_request_of_the_wrong_kind_fails_with_the_reason(stacks: Stack) -> None:
    with stacks.redis() as r:
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
