"""Two base models behind one gateway (GATEWAY_MODELS_CONFIG), each served by a cell of its own: a
real batcher and worker per cell, a real gateway and Celery worker, two tiny random models of
different vocabularies. Each request's greedy tokens equal its own model's `generate`; /v1/models,
the 404 of an unknown model, the per-model metrics and a batch naming both models follow."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.gpu.gpu_parity import reference_greedy
from gateway.settings import GatewaySettings
from harness.gateway.gateway_server import start_server
from harness.load.batch_runs import request_line
from harness.load.load_clients import completion_body
from harness.models.tiny_model import build_tiny_model
from harness.processes.redis_server import redis_server
from harness.processes.services import Stack, wait_for
from tests.stack.batch.test_batch_api import file_lines, run_batch

# Served name -> cell; each model's worker and batcher run in its cell.
CELLS = {"model-a": "a", "model-b": "b"}
PROMPTS = [[5, 17, 40, 9], [120, 3, 77, 200, 31, 8, 66]]
MAX_TOKENS = 12


@dataclass
class TwoModels:
    stack: Stack  # the batchers, workers and the Celery worker
    url: str  # the gateway's
    dirs: dict[str, Path]  # served name -> model directory

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def two(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoModels]:
    root = tmp_path_factory.mktemp("two-models")
    # The second model: other weights and a smaller vocabulary (another tokenizer too).
    dirs = {"model-a": tiny_model_dir, "model-b": build_tiny_model(root / "tiny-b", seed=1, vocab_size=384)}
    config = root / "models.json"
    entries = [
        {"model": str(d), "served_model_name": name, "cells": [CELLS[name]]} for name, d in dirs.items()
    ]
    config.write_text(json.dumps({"models": entries}))
    with redis_server(root) as redis_url:
        stack = Stack(redis_url=redis_url, model_dir=tiny_model_dir, log_dir=root)
        server: uvicorn.Server | None = None
        thread: threading.Thread | None = None
        try:
            for name, model_dir in dirs.items():
                cell = CELLS[name]
                stack.start_batcher(f"{cell}-batcher", CBSERVE_CELL=cell)
                worker = ["gpu_worker", "--model", str(model_dir), "--device", "cpu"]
                stack._spawn(f"{cell}-worker", worker, {"CBSERVE_CELL": cell, "WORKER_NUM_THREADS": "1"})
            celery = [
                "celery",
                "-A",
                "cbserve_celery.worker",
                "worker",
                "--pool",
                "threads",
                "--without-gossip",
            ]
            stack._spawn(
                "celery", [*celery, "--without-mingle"], {"CBSERVE_CELERY_MODELS_CONFIG": str(config)}
            )
            for cell in CELLS.values():

                def joined(cell: str = cell) -> bool:
                    stack.check_alive()
                    return stack.num_workers_joined(cell) >= 1

                wait_for(joined, 120, f"cell {cell}'s worker to join")
            settings = GatewaySettings(models_config=config, redis_url=redis_url, request_timeout_s=120)
            server, thread, url = start_server(settings)
            wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, 30, "/health to answer 200")
            yield TwoModels(stack, url, dirs)
        finally:
            if server is not None and thread is not None:
                server.should_exit = True
                thread.join(timeout=15)
            stack.stop()


@pytest.fixture(scope="module")
def references(two: TwoModels) -> dict[str, list[list[int]]]:
    """Each model's own greedy `generate` of every prompt, alone."""
    return {name: reference_greedy(d, PROMPTS, MAX_TOKENS) for name, d in two.dirs.items()}


def test_each_models_requests_are_its_own_generate(
    two: TwoModels, references: dict[str, list[list[int]]]
) -> None:
    assert references["model-a"] != references["model-b"]
    with httpx.Client(base_url=two.url, timeout=120) as client:
        for name in CELLS:
            for prompt, expected in zip(PROMPTS, references[name], strict=True):
                body = {**completion_body(prompt, MAX_TOKENS, stream=False), "model": name}
                response = client.post("/v1/completions", json=body)
                assert response.status_code == 200, response.text
                answer = response.json()
                assert answer["model"] == name
                # Placed in the model's own cell: its id says which.
                assert answer["id"].startswith(f"cmpl-{CELLS[name]}~")
                assert answer["choices"][0]["token_ids"] == expected
    # Chat through the SDK, each model templated by its own tokenizer.
    with two.sdk() as sdk:
        for name in CELLS:
            chat = sdk.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
            )
            assert chat.model == name and chat.usage is not None and chat.usage.completion_tokens >= 1


def test_models_lists_both_and_an_unknown_model_is_a_404_naming_them(two: TwoModels) -> None:
    with two.sdk() as sdk:
        cards = sdk.models.list().data
        assert [card.id for card in cards] == list(CELLS)
        assert [card.model_extra and card.model_extra["max_model_len"] for card in cards] == [512, 512]
        assert sdk.models.retrieve("model-b").id == "model-b"
        with pytest.raises(openai.NotFoundError) as raised:
            sdk.completions.create(model="model-c", prompt="Hi", max_tokens=2)
    assert raised.value.body == {
        "message": "The model `model-c` does not exist; this server serves `model-a`, `model-b`.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


def test_metrics_are_labelled_by_model(two: TwoModels) -> None:
    with httpx.Client(base_url=two.url, timeout=120) as client:
        for name in CELLS:
            body = {**completion_body([7, 8, 9], 3, stream=False), "model": name}
            assert client.post("/v1/completions", json=body).status_code == 200
        samples = [s for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples]
        # The batcher metrics of model-b's cell, by ?model=.
        model_b = client.get("/metrics", params={"model": "model-b"}).text
    finished = {
        s.labels["model_name"]
        for s in samples
        if s.name == "cbserve:request_success_total" and s.labels["finished_reason"] == "length" and s.value
    }
    assert finished == set(CELLS)
    waiting = {
        (s.labels["model_name"], s.labels["cell"]) for s in samples if s.name == "vllm:num_requests_waiting"
    }
    assert waiting == set(CELLS.items())
    assert "cbserve:num_workers 1.0" in model_b


def test_a_batch_runs_each_line_on_the_model_it_names(
    two: TwoModels, references: dict[str, list[list[int]]]
) -> None:
    lines = [
        request_line(
            f"{name}-{i}", {**completion_body(p, MAX_TOKENS, stream=False), "model": name}, "/v1/completions"
        )
        for name in CELLS
        for i, p in enumerate(PROMPTS)
    ]
    lines.append(
        request_line(
            "unknown", {**completion_body([5], 2, stream=False), "model": "model-c"}, "/v1/completions"
        )
    )
    with two.sdk() as sdk:
        batch = run_batch(sdk, lines, "/v1/completions")
        assert batch.status == "completed", batch
        out = file_lines(sdk, batch.output_file_id)
        errors = file_lines(sdk, batch.error_file_id)
    for name in CELLS:
        for i, expected in enumerate(references[name]):
            response = out[f"{name}-{i}"]["response"]
            assert response["body"]["model"] == name
            assert response["body"]["choices"][0]["token_ids"] == expected
            assert response["request_id"].startswith(f"{CELLS[name]}~")
    assert errors["unknown"]["response"]["status_code"] == 404
    assert "`model-a`, `model-b`" in errors["unknown"]["response"]["body"]["error"]["message"]


def test_an_adapter_is_refused_while_the_models_workers_serve_none(two: TwoModels, tmp_path: Path) -> None:
    """These workers announce max_loras 0: no adapter may be loaded for their model."""
    settings = GatewaySettings(
        models_config=two.stack.log_dir / "models.json",
        redis_url=two.stack.redis_url,
        allow_runtime_lora_updating=True,
    )
    server, thread, url = start_server(settings)
    try:
        body = {"lora_name": "x", "lora_path": str(tmp_path), "base_model_name": "model-b"}
        response = httpx.post(f"{url}/v1/load_lora_adapter", json=body, timeout=30)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
    assert response.status_code == 400
    assert "no worker of model 'model-b' serves LoRA adapters" in response.json()["error"]["message"]
