"""A DeepSeek-R1-style chat template (its generation prompt opens `<think>`; it never writes
`</think>` itself) served with vLLM's parser name `deepseek_r1`, and with `auto`: the thoughts the
model writes before `</think>` come back as `reasoning_content`, the rest as `content`. Before,
`deepseek_r1` stopped the gateway at start, and `auto` did not see the template as a thinking one, so
the thoughts landed in `content`."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from gateway.settings import GatewaySettings
from harness.gateway.gateway_server import start_server
from harness.gateway.stream_harness import StreamHarness
from harness.models.tiny_model import build_tiny_model

R1_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + message['content'] + eos_token }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{%- endif %}"
)
THOUGHTS, ANSWER = "the user asks", "Paris"


@pytest.fixture(scope="module")
def r1_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("r1-models") / "r1"
    return build_tiny_model(path, chat_template=R1_TEMPLATE, added_tokens=["<think>", "</think>"])


@pytest.fixture(params=["deepseek_r1", "auto"])
def gateway(
    request: pytest.FixtureRequest, r1_dir: Path, redis_url: str
) -> Iterator[tuple[str, StreamHarness]]:
    settings = GatewaySettings(model=r1_dir, redis_url=redis_url, reasoning_parser=request.param)
    server, thread, url = start_server(settings)
    harness = StreamHarness(redis_url)
    harness.heartbeat()
    try:
        yield url, harness
    finally:
        harness.close()
        server.should_exit = True
        thread.join(timeout=15)


def test_thoughts_before_the_close_are_reasoning(gateway: tuple[str, StreamHarness], r1_dir: Path) -> None:
    url, harness = gateway
    tokenizer = AutoTokenizer.from_pretrained(r1_dir)
    output = tokenizer.encode(f"{THOUGHTS}</think>{ANSWER}", add_special_tokens=False)
    body = {"messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": len(output)}
    with ThreadPoolExecutor(max_workers=1) as pool:
        reply = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=30)
        request = harness.next_request()
        harness.emit_tokens(request.req_id, output)
        message = reply.result(timeout=30).json()["choices"][0]["message"]
    assert message["reasoning_content"].strip() == THOUGHTS, message
    assert message["content"].strip() == ANSWER, message
