"""Images through the real gateway (uvicorn, a vision-language model's processor, Redis) as the OpenAI
and Anthropic SDKs send them with their defaults: chat's image_url parts, the Responses API's
input_image, Messages' base64 image blocks. What reaches the requests stream (read back from Redis by
a stand-in worker) is the processor's prompt with each image's feature; the three surfaces send the
same conversation as the same request. Refusals come back in each API's error shape, by name."""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import uvicorn

from common.protocol import GenerateRequest
from gateway.settings import GatewaySettings
from harness.gateway.gateway_server import start_server
from harness.gateway.responder import responding
from harness.models.vision import data_url, make_image
from harness.processes.celery_thread import celery_in_thread
from openai_frontend.model.served_model import ModelRules, ServedModel
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.model.vision_processor import load_vision_processor

PNG = make_image(11, (64, 48))
QUESTION = "What is in this picture?"
FAMILY = "qwen2_5_vl"  # dynamic resolution: the token count depends on the image


@pytest.fixture()
def vlm_gateway(redis_url: str, vision_model_dirs: Callable[[str], Path]) -> Iterator[str]:
    settings = GatewaySettings(
        model=vision_model_dirs(FAMILY),
        redis_url=redis_url,
        request_timeout_s=60,
        limit_mm_per_prompt={"image": 2},
    )
    server, thread, url = start_server(settings)
    try:
        yield url
    finally:
        _stop(server, thread)


def _stop(server: uvicorn.Server, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(timeout=15)


def expected_request(model_dir: Path) -> GenerateRequest:
    """The request the front end makes of the conversation itself (tests/unit/openai_frontend/
    generate/test_image_prompts.py checks it against the processor's own output)."""
    from openai_frontend.generate.request_builder import prepare_choices
    from openai_frontend.protocol.openai_schemas import ChatCompletionRequest

    served = ServedModel(
        rules=ModelRules(name="x", max_model_len=512),
        root=str(model_dir),
        tokenizer=ModelTokenizer(model_dir),
        vision=load_vision_processor(model_dir),
    )
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": data_url(PNG)}}]
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": content}]})
    return prepare_choices(body, served, 0.0, req_id="r")[0].message


def test_sdks_send_images_that_reach_the_requests_stream(
    vlm_gateway: str, redis_url: str, vision_model_dirs: Callable[[str], Path]
) -> None:
    expected = expected_request(vision_model_dirs(FAMILY))
    assert expected.mm_features
    image_url = data_url(PNG)
    with (
        responding(redis_url) as responder,
        openai.OpenAI(base_url=f"{vlm_gateway}/v1", api_key="unused", max_retries=0) as client,
        anthropic.Anthropic(base_url=vlm_gateway, api_key="unused", max_retries=0) as claude,
    ):
        chat = client.chat.completions.create(
            model=FAMILY,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": QUESTION},
                        {"type": "image_url", "image_url": {"url": image_url}},
                    ],
                }
            ],
            max_tokens=2,
        )
        response = client.responses.create(
            model=FAMILY,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": QUESTION},
                        {"type": "input_image", "image_url": image_url, "detail": "auto"},
                    ],
                }
            ],
            max_output_tokens=2,
        )
        message = claude.messages.create(
            model=FAMILY,
            max_tokens=2,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": QUESTION},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": base64.b64encode(PNG).decode(),
                            },
                        },
                    ],
                }
            ],
        )
        requests = list(responder.requests)
    assert len(requests) == 3
    for request in requests:
        assert request.prompt_token_ids == expected.prompt_token_ids
        assert request.mm_features == expected.mm_features
    # usage counts the expanded prompt, on every surface.
    num_prompt_tokens = len(expected.prompt_token_ids)
    assert chat.usage is not None and chat.usage.prompt_tokens == num_prompt_tokens
    assert response.usage is not None and response.usage.input_tokens == num_prompt_tokens
    assert message.usage.input_tokens == num_prompt_tokens


def test_refusals_in_each_apis_shape(vlm_gateway: str, redis_url: str) -> None:
    three = [{"type": "image_url", "image_url": {"url": data_url(PNG)}}] * 3
    with responding(redis_url) as responder:
        answer = httpx.post(
            f"{vlm_gateway}/v1/chat/completions", json={"messages": [{"role": "user", "content": three}]}
        )
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == "too_many_images"
        private = {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data"}}
        answer = httpx.post(
            f"{vlm_gateway}/v1/chat/completions", json={"messages": [{"role": "user", "content": [private]}]}
        )
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "image_url_not_allowed"
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%%"}}
        answer = httpx.post(
            f"{vlm_gateway}/v1/messages",
            json={"model": FAMILY, "max_tokens": 2, "messages": [{"role": "user", "content": [block]}]},
        )
        assert answer.status_code == 400
        body = answer.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert "base64" in body["error"]["message"]
        assert responder.requests == []  # nothing refused was queued


def test_celery_task_takes_a_conversation_with_images(
    redis_url: str, vision_model_dirs: Callable[[str], Path]
) -> None:
    """`cbserve.generate` with chat messages: the same request as the chat endpoint's, through a real
    Celery worker; its batch task renders lines by the same builder, with the same processor."""
    from cbserve_celery.app import GENERATE_TASK
    from cbserve_celery.model_tokenizers import ModelTokenizers

    model_dir = vision_model_dirs(FAMILY)
    expected = expected_request(model_dir)
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": data_url(PNG)}}]
    with responding(redis_url) as responder, celery_in_thread(redis_url, model_dir) as app:
        generate = app.tasks[GENERATE_TASK]
        out = generate.delay([{"role": "user", "content": content}], {"max_tokens": 2}).get(timeout=60)
    [request] = responder.requests
    assert request.prompt_token_ids == expected.prompt_token_ids
    assert request.mm_features == expected.mm_features
    assert len(out["token_ids"]) == 2
    # A batch's lines are served with the model's processor too.
    served, _ = ModelTokenizers(model_dir, None).for_batch([ModelRules(name="x", max_model_len=512)])
    assert served is not None and served.default.vision is not None
