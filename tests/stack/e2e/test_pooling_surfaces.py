"""The pooling path's other ways in, on one real stack: `/v1/embeddings` lines of the Batch API and the
`cbserve.embed` task (a real `celery worker`), vLLM's `/classify`, a chat model's own hidden states
served as embeddings when the operator converts it (WORKER_CONVERT=embed), the gateway's request
metrics of pooling requests, and a generation model asked for embeddings before its workers joined.

One Redis, one gateway of four models (GATEWAY_MODELS_CONFIG), each in a cell of its own with its
batcher: a sentence-transformers BERT embedder (`bert`), a BERT classifier of three labels (`cls`),
the tiny Llama chat model converted to an embedding model (`hid`), and the same chat model generating
(`chat`), whose worker starts only in the last test.
"""

from __future__ import annotations

import base64
import functools
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from cbserve_celery.app import make_app
from cbserve_celery.embedding import EMBED_TASK
from cbserve_celery.settings import CelerySettings
from harness.load.batch_runs import jsonl, request_line
from harness.models.pooling_models import build_bert_embedder, build_classifier, sentences
from harness.processes.redis_server import free_port, redis_server
from harness.processes.services import Stack, wait_for

TEXTS = sentences(12)
CELLS = {"bert": "bert", "cls": "cls", "hid": "hid", "chat": "gen"}  # model -> its cell


@dataclass
class Surfaces:
    stack: Stack  # the Redis and every process
    url: str  # the gateway
    models: dict[str, Path]  # served name -> directory
    models_config: Path


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Surfaces]:
    root = tmp_path_factory.mktemp("pooling-surfaces-models")
    models = {
        "bert": build_bert_embedder(root / "bert"),
        "cls": build_classifier(root / "cls"),
        "hid": tiny_model_dir,
        "chat": tiny_model_dir,
    }
    log_dir = tmp_path_factory.mktemp("pooling-surfaces")
    models_config = log_dir / "models.json"
    entries = [{"model": str(models[n]), "served_model_name": n, "cells": [c]} for n, c in CELLS.items()]
    models_config.write_text(json.dumps({"models": entries}))
    with redis_server(log_dir) as redis_url:
        stack = Stack(redis_url, tiny_model_dir, log_dir)
        try:
            for cell in CELLS.values():
                stack.start_batcher(f"batcher-{cell}", CBSERVE_CELL=cell)
            for name in ("bert", "cls"):
                Stack(redis_url, models[name], log_dir, stack.procs).start_worker(
                    f"worker-{name}", CBSERVE_CELL=CELLS[name], WORKER_MAX_NUM_BATCHED_TOKENS="256"
                )
            # The operator's switch (vLLM's --convert embed): the chat checkpoint, served as embeddings.
            stack.start_worker("worker-hid", CBSERVE_CELL="hid", WORKER_CONVERT="embed")
            stack.start_celery_worker(CBSERVE_CELERY_MODELS_CONFIG=str(models_config))
            port = free_port()
            args = ["gateway", "--host", "127.0.0.1", "--port", str(port)]
            stack._spawn("gateway", args, {"GATEWAY_MODELS_CONFIG": str(models_config)})
            stack.base_url = f"http://127.0.0.1:{port}"
            for cell in ("bert", "cls", "hid"):
                wait_for(functools.partial(_joined, stack, cell), 240, f"the worker of cell {cell}")
            # Not /health: it answers 503 until the chat model has a worker, which comes last.
            wait_for(lambda: stack.answers("/v1/models"), 120, "the gateway")
            yield Surfaces(stack, stack.base_url, models, models_config)
        finally:
            stack.stop()


def _joined(stack: Stack, cell: str) -> bool:
    stack.check_alive()
    return stack.num_workers_joined(cell) >= 1


def _cosines(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)


def _st_encode(model_dir: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    return np.stack([model.encode([text])[0] for text in texts])  # one at a time: no padding


def _lines(client: openai.OpenAI, file_id: str) -> dict[str, dict[str, Any]]:
    """A batch output or error file's lines by custom_id."""
    lines = map(json.loads, client.files.content(file_id).text.splitlines())
    return {line["custom_id"]: line for line in lines}


def _floats(embedding: list[float] | str) -> list[float]:
    """An embedding as numbers: as they are, or from base64 of little-endian float32 bytes."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4").tolist()
    return embedding


def test_batch_embeddings_lines_and_the_embed_task_match_sentence_transformers(surfaces: Surfaces) -> None:
    client = openai.OpenAI(base_url=f"{surfaces.url}/v1", api_key="unused", max_retries=0, timeout=60)
    bodies: dict[str, dict[str, Any]] = {
        f"one-{i}": {"model": "bert", "input": text} for i, text in enumerate(TEXTS[:6])
    }
    bodies["several"] = {"model": "bert", "input": TEXTS[6:], "encoding_format": "float"}
    bodies["base64"] = {"model": "bert", "input": TEXTS[0], "encoding_format": "base64"}
    bodies["no-such-model"] = {"model": "gpt-4o", "input": "a"}
    bodies["dimensions"] = {"model": "bert", "input": "a", "dimensions": 8}  # refused by the batcher
    bodies["unknown-field"] = {"model": "bert", "input": TEXTS[0], "extra": 1}
    lines = [request_line(cid, body, "/v1/embeddings") for cid, body in bodies.items()]
    upload = client.files.create(file=("embed.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")

    def ended() -> bool:
        nonlocal batch
        batch = client.batches.retrieve(batch.id)
        return batch.status in ("completed", "failed", "expired", "cancelled")

    wait_for(ended, 180, "the embeddings batch to end", interval=0.2)
    assert batch.status == "completed" and batch.request_counts is not None, batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (8, 3)
    assert batch.output_file_id is not None and batch.error_file_id is not None
    done, failed = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)

    ref = _st_encode(surfaces.models["bert"], TEXTS)
    vectors = [done[f"one-{i}"]["response"]["body"]["data"][0]["embedding"] for i in range(6)]
    vectors += [d["embedding"] for d in done["several"]["response"]["body"]["data"]]
    assert _cosines(np.array(vectors), ref).min() >= 0.99999
    body = done["several"]["response"]["body"]
    assert (body["object"], body["model"]) == ("list", "bert")
    assert [d["index"] for d in body["data"]] == list(range(6))
    # Each line's body is what POST /v1/embeddings answers for it.
    for custom_id in ("one-0", "base64"):
        interactive = httpx.post(f"{surfaces.url}/v1/embeddings", json=bodies[custom_id], timeout=60).json()
        got = done[custom_id]["response"]["body"]
        assert got["usage"] == interactive["usage"] and got["model"] == interactive["model"]
        assert _floats(got["data"][0]["embedding"]) == pytest.approx(
            _floats(interactive["data"][0]["embedding"]), abs=1e-6
        )
    codes = {cid: line["response"]["status_code"] for cid, line in failed.items()}
    assert codes == {"no-such-model": 404, "dimensions": 400, "unknown-field": 400}
    errors = {cid: line["response"]["body"]["error"] for cid, line in failed.items()}
    assert "does not support matryoshka" in errors["dimensions"]["message"]
    assert errors["unknown-field"]["param"] == "extra"

    # The Celery task of the same kind, by name, as any Celery client sends it.
    app = make_app(CelerySettings(redis_url=surfaces.stack.redis_url, models_config=surfaces.models_config))
    try:
        answer = app.tasks[EMBED_TASK].delay(TEXTS[:3], "bert").get(timeout=120)
    finally:
        app.close()
    assert _cosines(np.array([d["embedding"] for d in answer["data"]]), ref[:3]).min() >= 0.99999
    assert answer["usage"]["prompt_tokens"] > 0 and answer["req_id"].startswith("bert~celery-")


def test_classify_gives_transformers_softmax_and_the_label(surfaces: Surfaces) -> None:
    path = surfaces.models["cls"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    texts = TEXTS[:5]
    with torch.no_grad():
        ref = [
            torch.softmax(model(**tokenizer(t, return_tensors="pt")).logits[0], -1).tolist() for t in texts
        ]
    for route in ("/classify", "/v1/classify"):
        answer = httpx.post(f"{surfaces.url}{route}", json={"model": "cls", "input": texts}, timeout=60)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["object"], body["model"]) == ("list", "cls") and body["id"].startswith("classify-")
        for i, (item, probs) in enumerate(zip(body["data"], ref, strict=True)):
            assert (item["index"], item["num_classes"]) == (i, 3)
            assert item["probs"] == pytest.approx(probs, abs=1e-5)
            assert item["label"] == model.config.id2label[int(np.argmax(probs))]
        num_tokens = sum(len(tokenizer(t)["input_ids"]) for t in texts)
        assert body["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
    one = httpx.post(f"{surfaces.url}/classify", json={"model": "cls", "input": texts[0]}, timeout=60).json()
    assert len(one["data"]) == 1 and one["data"][0]["probs"] == pytest.approx(ref[0], abs=1e-5)
    refused = httpx.post(f"{surfaces.url}/classify", json={"model": "bert", "input": "a"}, timeout=60)
    assert refused.status_code == 400 and "serves embed, not classify" in refused.json()["error"]["message"]


def test_a_chat_model_converted_to_embed_gives_its_last_hidden_state_normalized(surfaces: Surfaces) -> None:
    client = openai.OpenAI(base_url=f"{surfaces.url}/v1", api_key="unused", max_retries=0, timeout=60)
    texts = TEXTS[:8]
    reply = client.embeddings.create(model="hid", input=texts)  # the SDK's default: base64
    ours = np.array([d.embedding for d in reply.data])
    path = surfaces.models["hid"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()  # the checkpoint's base model: no LM head
    with torch.no_grad():
        last = [model(**tokenizer(t, return_tensors="pt")).last_hidden_state[0, -1] for t in texts]
    ref = torch.nn.functional.normalize(torch.stack(last), dim=-1).numpy()
    assert _cosines(ours, ref).min() >= 0.99999
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert reply.usage.prompt_tokens == sum(len(tokenizer(t)["input_ids"]) for t in texts)
    with pytest.raises(openai.BadRequestError, match="is a pooling model"):
        client.chat.completions.create(
            model="hid", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_pooling_requests_are_counted_in_the_gateways_request_metrics(surfaces: Surfaces) -> None:
    before = _samples(surfaces.url)
    client = openai.OpenAI(base_url=f"{surfaces.url}/v1", api_key="unused", max_retries=0, timeout=60)
    reply = client.embeddings.create(model="bert", input=TEXTS[:4])
    after = _samples(surfaces.url)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("cbserve:request_success_total", model_name="bert", finished_reason="stop") == 4
    assert grew("cbserve:e2e_request_latency_seconds_count", model_name="bert") == 4
    assert grew("cbserve:prompt_tokens_total", model_name="bert") == reply.usage.prompt_tokens
    # No tokens stream from a pooling request: no time to a first token, no gaps between tokens.
    assert _value(after, "cbserve:time_to_first_token_seconds_count", model_name="bert") == 0
    assert _value(after, "cbserve:inter_token_latency_seconds_count", model_name="bert") == 0


def test_embeddings_of_a_generation_model_are_a_400_even_before_its_workers_join(surfaces: Surfaces) -> None:
    """The gateway takes the request while the cell shows no worker; its batcher refuses it once a
    generating worker joins: a 400 naming what the model does not serve, not a server error."""
    stack = surfaces.stack
    answers: list[httpx.Response] = []
    body = {"model": "chat", "input": "hello"}
    thread = threading.Thread(
        target=lambda: answers.append(httpx.post(f"{surfaces.url}/v1/embeddings", json=body, timeout=120))
    )
    thread.start()
    wait_for(lambda: stack.stats("gen").get("num_waiting", 0) >= 1, 60, "the request waiting in cell gen")
    stack.start_worker("worker-chat", CBSERVE_CELL="gen")
    thread.join(timeout=180)
    [answer] = answers
    error = answer.json()["error"]
    assert answer.status_code == 400, answer.text
    assert error["type"] == "invalid_request_error" and "does not serve embeddings" in error["message"]
    # Once the gateway has seen the worker, it refuses the same way before queueing.
    wait_for(functools.partial(_joined, stack, "gen"), 120, "the chat worker")
    again = httpx.post(f"{surfaces.url}/v1/embeddings", json=body, timeout=60)
    assert again.status_code == 400 and "does not serve embeddings" in again.json()["error"]["message"]
    assert (
        _value(
            _samples(surfaces.url),
            "cbserve:request_success_total",
            model_name="chat",
            finished_reason="error",
        )
        == 1
    )
