"""Images through the pipeline (a batcher and two workers over a real Redis, requests on the requests
stream as any queue client sends them): for tiny random LLaVA, Qwen2.5-VL and Gemma 3 models, greedy
tokens of requests with one and two images, batched with a text-only one, equal transformers'
`generate` for each alone, and an image sent again is encoded once (the workers' counters, summed by
the batcher for /metrics); a LLaVA worker SIGKILLed mid-request hands its requests, images included,
to the other, which encodes them again and goes on with the same tokens."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from common.metrics_schema import MetricsSnapshot, decode_snapshot
from common.protocol import GenerateRequest, MultiModalFeature, SamplingParams
from common.stream_client import follow, new_req_id, submit
from common.streams import DEFAULT_CELL, cell_keys, token_stream
from harness.load.fault_clients import FAST_HEARTBEAT_ENV, WORKER_ENV
from harness.models.vision_reference import ReferenceModel, build_model, chat_text, image
from harness.processes.services import Stack, wait_for

MAX_TOKENS = 12


FAMILIES = ("llava", "qwen2_5_vl", "gemma3")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, ReferenceModel]]:
    """Each family's checkpoint and reference, built when a test first asks for it."""
    return {}


@pytest.fixture()
def family_model(
    request: pytest.FixtureRequest,
    models: dict[str, tuple[Path, ReferenceModel]],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, ReferenceModel]:
    family: str = getattr(request, "param", "llava")
    if family not in models:
        model_dir = build_model(tmp_path_factory.mktemp(family) / family, family)
        models[family] = (model_dir, ReferenceModel(model_dir))
    return models[family]


@pytest.fixture()
def reference(family_model: tuple[Path, ReferenceModel]) -> ReferenceModel:
    return family_model[1]


@pytest.fixture()
def stack(redis_url: str, family_model: tuple[Path, ReferenceModel], tmp_path: Path) -> Iterator[Stack]:
    """A batcher and two workers of the model (no gateway: the requests go on the stream)."""
    s = Stack(redis_url=redis_url, model_dir=family_model[0], log_dir=tmp_path)
    try:
        s.start_batcher(**FAST_HEARTBEAT_ENV)
        for name in ("worker0", "worker1"):
            s.start_worker(name, **WORKER_ENV)
        wait_for(lambda: _alive(s) and s.num_workers_joined() >= 2, 120, "two workers to join")
        yield s
    finally:
        s.stop()


def _alive(s: Stack) -> bool:
    s.check_alive()
    return True


def request(reference: ReferenceModel, question: str, images: list[Any], max_tokens: int) -> GenerateRequest:
    text = chat_text(reference.processor, question, len(images))
    ids, features = reference.vision.process(text, images, add_special_tokens=True)
    return GenerateRequest(
        req_id=new_req_id(),
        prompt_token_ids=ids,
        sampling_params=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        arrival_time=time.time(),
        mm_features=features or None,
    )


def cases(reference: ReferenceModel, max_tokens: int) -> list[tuple[GenerateRequest, str, list[Any]]]:
    specs: list[tuple[str, list[Any]]] = [
        ("What is in the picture?", [image(1)]),
        ("What does the import statement do?", []),
        ("Compare them.", [image(2), image(3, (48, 64))]),
        ("What is in the picture?", [image(1)]),  # the first request again
    ]
    made = []
    for question, images in specs:
        req = request(reference, question, images, max_tokens)
        made.append((req, chat_text(reference.processor, question, len(images)), images))
    return made


def tokens(client: redis.Redis, req_id: str) -> list[int]:
    return [event.token_id for event in follow(client, req_id, timeout_s=120)]


def metrics(client: redis.Redis) -> MetricsSnapshot | None:
    """The batcher's last /metrics snapshot."""
    raw = client.get(cell_keys(DEFAULT_CELL).metrics)
    return None if raw is None else decode_snapshot(raw)


@pytest.mark.parametrize("family_model", FAMILIES, indirect=True)
def test_images_batched_with_text_equal_generate(stack: Stack, reference: ReferenceModel) -> None:
    made = cases(reference, MAX_TOKENS)
    with stack.redis() as client:
        for req, _, _ in made[:3]:
            submit(client, req)
        got = {req.req_id: tokens(client, req.req_id) for req, _, _ in made[:3]}
        # The first request again, once the batch is done: its cached blocks draw it to the worker
        # that holds them, which does not encode its image again.
        last, _, _ = made[3]
        submit(client, last)
        got[last.req_id] = tokens(client, last.req_id)
        for req, text, images in made:
            assert got[req.req_id] == reference.greedy(text, images, MAX_TOKENS), text
        stack.stats_after(4)
        done = time.time()  # the snapshot published after this counts every step
        wait_for(lambda: (m := metrics(client)) is not None and m.updated_at > done, 10, "fresh metrics")
        snapshot = metrics(client)
    assert snapshot is not None
    runs = sum(w.num_encoder_runs for w in snapshot.workers.values())
    assert runs == 3  # three distinct images, each encoded once in the whole pipeline


def test_a_killed_worker_s_image_requests_resume_with_the_same_tokens(
    stack: Stack, reference: ReferenceModel
) -> None:
    max_tokens = 160
    made = [(request(reference, f"Picture {i}?", [image(40 + i)], max_tokens), i) for i in range(6)]
    with stack.redis() as client:
        for req, _ in made:
            submit(client, req)
        wait_for(
            lambda: all(client.xlen(token_stream(req.req_id)) >= 3 for req, _ in made),
            60,
            "every request's first tokens",
        )
        stack.procs["worker1"].send_signal(signal.SIGKILL)
        stack.procs["worker1"].wait(timeout=10)
        del stack.procs["worker1"]
        got = {req.req_id: tokens(client, req.req_id) for req, _ in made}
    stats = stack.stats_after(len(made))
    assert stats["num_failed"] == 0 and stats["num_failovers"] >= 1, stats
    for req, i in made:
        text = chat_text(reference.processor, f"Picture {i}?", 1)
        assert got[req.req_id] == reference.greedy(text, [image(40 + i)], max_tokens), i


def test_features_round_trip_the_wire(reference: ReferenceModel) -> None:
    """What the worker decodes is what the processor made (bytes, dtype and shape)."""
    import torch

    from common.protocol import decode_request, encode
    from gpu_worker.runner.multimodal.mm_inputs import tensor_of

    req = request(reference, "Look.", [image(5)], 4)
    back = decode_request(encode(req))
    assert isinstance(back, GenerateRequest) and back.mm_features is not None
    feature: MultiModalFeature = back.mm_features[0]
    pixels = reference.processor(text=["<image>"], images=[image(5)], return_tensors="pt")["pixel_values"]
    assert torch.equal(tensor_of(feature.data["pixel_values"]), pixels.float())
