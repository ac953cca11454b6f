"""The vLLM and OpenAI request options clients send (issue 26), each by what it changes: the prompt
the batcher gets, the text and usage the client gets. The gateway runs for real; the test harness
plays the worker, so every token is the test's choice."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer, processors

from common.protocol import PromptEvent, encode
from gateway.settings import GatewaySettings
from harness.gateway.gateway_server import RunningGateway, start_server
from harness.gateway.sse_client import post_sse
from harness.gateway.stream_harness import StreamHarness
from openai_frontend.model.chatml import EOS, IM_END, IM_START

# A template that reads what clients may hand it: chat_template_kwargs' enable_thinking, reasoning_effort.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking %}<think>{{ reasoning_effort }}{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


@pytest.fixture()
def pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2)


@pytest.fixture(scope="module")
def bos_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a tokenizer that puts BOS before a text, and a template reading extra variables."""
    path = tmp_path_factory.mktemp("bos-model")
    shutil.copytree(tiny_model_dir, path, dirs_exist_ok=True)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    bos = tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{EOS} $A", special_tokens=[(EOS, bos)])
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "chat_template.jinja").write_text(THINKING_TEMPLATE)
    return path


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def _post(
    gw: RunningGateway, pool: ThreadPoolExecutor, path: str, body: dict[str, Any]
) -> Future[httpx.Response]:
    return pool.submit(gw.client.post, path, json=body)


def test_continuous_usage_stats_puts_usage_on_every_chunk(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer
) -> None:
    # guidellm's default request: a stream asking for usage on every chunk.
    body = {
        "messages": [{"role": "user", "content": "Return the value"}],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    future = pool.submit(post_sse, gateway.client, "/v1/chat/completions", body)
    request = gateway.harness.next_request()
    output = _ids(tok, " the value of")[:3]
    gateway.harness.emit_tokens(request.req_id, output, finish_reason="length")
    response, events = future.result(timeout=30)
    assert response.status_code == 200
    chunks = [e.json() for e in events if e.data != "[DONE]"]
    prompt_tokens = len(request.prompt_token_ids)
    assert all(c["usage"]["prompt_tokens"] == prompt_tokens for c in chunks)
    completion_tokens = [c["usage"]["completion_tokens"] for c in chunks]
    assert completion_tokens == sorted(completion_tokens) and completion_tokens[0] == 0
    assert chunks[-1]["choices"] == [] and completion_tokens[-1] == 3  # the final usage chunk


def test_include_stop_str_in_output_keeps_the_stop_string(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer
) -> None:
    body = {"prompt": "Return the", "max_tokens": 50, "stop": ["STOP"], "include_stop_str_in_output": True}
    future = _post(gateway, pool, "/v1/completions", body)
    request = gateway.harness.next_request()
    gateway.harness.emit_tokens(request.req_id, _ids(tok, " the value. STOP and more"), finish_reason=None)
    choice = future.result(timeout=30).json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (" the value. STOP", "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_skip_special_tokens_false_shows_special_tokens(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer, stream: bool
) -> None:
    output = [*_ids(tok, " the"), tok.token_to_id(IM_START), *_ids(tok, " value"), tok.token_to_id(IM_END)]
    texts = {}
    for skip in (True, False):
        body = {"prompt": "Return", "max_tokens": 8, "skip_special_tokens": skip, "stream": stream}
        body |= {"include_stop_str_in_output": not skip}  # the ending token too
        if stream:
            future: Future[Any] = pool.submit(post_sse, gateway.client, "/v1/completions", body)
        else:
            future = _post(gateway, pool, "/v1/completions", body)
        request = gateway.harness.next_request()
        gateway.harness.emit_tokens(request.req_id, output, finish_reason="stop")
        if stream:
            chunks = [e.json() for e in future.result(timeout=30)[1] if e.data != "[DONE]"]
            texts[skip] = "".join(c["choices"][0]["text"] for c in chunks)
        else:
            texts[skip] = future.result(timeout=30).json()["choices"][0]["text"]
    assert texts[True] == " the value"
    assert texts[False] == f" the{IM_START} value{IM_END}"


def test_truncate_prompt_tokens_keeps_the_last_tokens(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer
) -> None:
    prompt = "Return the value of the object and raise an error"
    body = {"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": 4}
    future = _post(gateway, pool, "/v1/completions", body)
    request = gateway.harness.next_request()
    assert request.prompt_token_ids == _ids(tok, prompt)[-4:]
    gateway.harness.emit_tokens(request.req_id, _ids(tok, " ok")[:1])
    assert future.result(timeout=30).json()["usage"]["prompt_tokens"] == 4
    bad = gateway.client.post("/v1/completions", json=body | {"truncate_prompt_tokens": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "truncate_prompt_tokens"


def test_priority_metadata_and_safety_identifier_are_kept_with_the_request(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    # On the follower's own logger: the gateway's logging set-up replaces the root's handlers.
    follower_log = logging.getLogger("openai_frontend.follow.request_follower")
    follower_log.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger=follower_log.name)
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "priority": 5,
        "metadata": {"team": "eval"},
        "safety_identifier": "user-42",
        "prompt_cache_key": "conversation-7",
    }
    future = _post(gateway, pool, "/v1/chat/completions", body)
    request = gateway.harness.next_request()
    assert (request.priority, request.user) == (1, "user-42")  # the Batch API's level
    gateway.harness.emit_tokens(request.req_id, _ids(tok, " ok")[:1])
    assert future.result(timeout=30).status_code == 200
    follower_log.removeHandler(caplog.handler)
    queued = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("request queued"))
    assert "user 'user-42'" in queued and '{"team": "eval"}' in queued  # logged with the request
    ahead = gateway.client.post("/v1/chat/completions", json=body | {"priority": -1})
    assert ahead.status_code == 400 and ahead.json()["error"]["param"] == "priority"
    too_many = gateway.client.post(
        "/v1/chat/completions", json=body | {"metadata": {str(i): "x" for i in range(17)}}
    )
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "metadata"
    too_long = gateway.client.post("/v1/chat/completions", json=body | {"safety_identifier": "u" * 257})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "safety_identifier"


def test_prompt_logprobs_in_vllms_shape(
    gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer
) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "prompt_logprobs": 1}
    future = _post(gateway, pool, "/v1/chat/completions", body)
    request = gateway.harness.next_request()
    assert request.sampling_params.prompt_logprobs == 1
    ids = request.prompt_token_ids
    other = next(t for t in range(3, 100) if t not in ids)
    n = len(ids) - 1
    prompt = PromptEvent(
        req_id=request.req_id,
        attempt=0,
        token_ids=ids,
        logprobs=[-1.0] * n,
        top_token_ids=[[ids[1]], *[[other]] * (n - 1)],
        top_logprobs=[[-1.0], *[[-0.5]] * (n - 1)],
    )
    gateway.harness.append(request.req_id, encode(prompt))
    gateway.harness.emit_tokens(request.req_id, _ids(tok, " ok")[:1])
    answer = future.result(timeout=30).json()
    logprobs = answer["prompt_logprobs"]
    assert len(logprobs) == len(ids) and logprobs[0] is None
    assert logprobs[1] == {
        str(ids[1]): {
            "logprob": -1.0,
            "rank": 1,
            "decoded_token": tok.decode([ids[1]], skip_special_tokens=False),
        }
    }
    assert logprobs[2][str(ids[2])]["rank"] is None and logprobs[2][str(other)]["rank"] == 1
    streamed = gateway.client.post("/v1/chat/completions", json=body | {"stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"


@pytest.fixture()
def bos_gateway(redis_url: str, bos_model_dir: Path) -> Iterator[RunningGateway]:
    settings = GatewaySettings(model=bos_model_dir, redis_url=redis_url, request_timeout_s=60)
    server, thread, url = start_server(settings)
    gw = RunningGateway(
        url, settings, httpx.Client(base_url=url, timeout=30), StreamHarness(redis_url), server.config.app
    )
    try:
        yield gw
    finally:
        gw.client.close()
        gw.harness.close()
        server.should_exit = True
        thread.join(timeout=15)


def test_template_controls(bos_gateway: RunningGateway, pool: ThreadPoolExecutor, tok: Tokenizer) -> None:
    gw = bos_gateway
    bos = tok.token_to_id(EOS)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Return the"}]

    def prompt_of(body: dict[str, Any], path: str = "/v1/chat/completions") -> list[int]:
        future = _post(gw, pool, path, {"max_tokens": 1, **body})
        request = gw.harness.next_request()
        gw.harness.emit_tokens(request.req_id, _ids(tok, " ok")[:1])
        assert future.result(timeout=30).status_code == 200
        return request.prompt_token_ids

    turns = f"{IM_START}user\nHi{IM_END}\n{IM_START}assistant\nReturn the{IM_END}\n"
    assert prompt_of({"messages": messages}) == _ids(tok, turns + f"{IM_START}assistant\n")
    assert prompt_of({"messages": messages, "add_generation_prompt": False}) == _ids(tok, turns)
    continued = {"messages": messages, "add_generation_prompt": False, "continue_final_message": True}
    assert prompt_of(continued) == _ids(tok, turns.removesuffix(f"{IM_END}\n"))
    thinking = {
        "messages": messages,
        "chat_template_kwargs": {"enable_thinking": True},
        "reasoning_effort": "low",
    }
    assert prompt_of(thinking) == _ids(tok, turns + f"{IM_START}assistant\n<think>low")
    assert prompt_of({"messages": messages, "add_special_tokens": True})[0] == bos
    # A completion prompt gets the tokenizer's BOS unless the client says not to.
    assert prompt_of({"prompt": "Return"}, "/v1/completions") == [bos, *_ids(tok, "Return")]
    assert prompt_of({"prompt": "Return", "add_special_tokens": False}, "/v1/completions") == _ids(
        tok, "Return"
    )
    both = gw.client.post("/v1/chat/completions", json=continued | {"add_generation_prompt": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    own = gw.client.post(
        "/v1/chat/completions", json={"messages": messages, "chat_template_kwargs": {"messages": []}}
    )
    assert own.status_code == 400 and own.json()["error"]["param"] == "chat_template_kwargs"


def test_reasoning_effort_is_refused_when_the_template_ignores_it(gateway: RunningGateway) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    for field, value in (("reasoning_effort", "low"), ("verbosity", "high")):
        response = gateway.client.post("/v1/chat/completions", json=body | {field: value})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == field
        assert "chat template does not read it" in response.json()["error"]["message"]
