"""`cbserve complete` and `cbserve chat` against a running stack, compared with the same HTTP requests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cbserve.defaults import DEFAULT_COMPLETE_MAX_TOKENS
from common.protocol import FIELD, decode_request
from common.streams import REQUESTS_STREAM
from harness.processes.services import ROOT, Stack

MODEL = "tiny-llama"  # the fixture model directory's name, which the gateway serves it as


@pytest.fixture()
def stack(make_stack: Callable[[], Stack]) -> Stack:
    return make_stack().start_all()


def cbserve(*args: str, stdin: str = "", url: str | None = None) -> subprocess.CompletedProcess[str]:
    """`cbserve ARGS`, with `CBSERVE_URL` set to `url` or unset."""
    env = {k: v for k, v in os.environ.items() if k != "CBSERVE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "cbserve", *args],
        cwd=ROOT,
        env=env if url is None else {**env, "CBSERVE_URL": url},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def greedy_completion(base_url: str, prompt: str) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["text"])


def greedy_chat(base_url: str, messages: list[dict[str, Any]]) -> str:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_complete_prints_the_same_text_as_the_api(stack: Stack) -> None:
    expected = greedy_completion(stack.base_url, "The object")
    assert expected
    args = ("complete", "The object", "--base-url", stack.base_url, "--max-tokens", "8", "--temperature", "0")
    streamed = cbserve(*args)
    assert (streamed.returncode, streamed.stderr) == (0, "")
    assert streamed.stdout == expected + "\n"
    # The SDK-style base URL (…/v1) and a non-streaming request give the same text too.
    plain = cbserve(*args[:3], f"{stack.base_url}/v1", *args[4:], "--no-stream")
    assert (plain.returncode, plain.stdout) == (0, expected + "\n")
    # Without --base-url the address comes from CBSERVE_URL, as in the README's other examples.
    from_env = cbserve(*args[:2], *args[4:], url=stack.base_url)
    assert (from_env.returncode, from_env.stdout) == (0, expected + "\n")
    # Without --max-tokens a completion is bounded (DEFAULT_COMPLETE_MAX_TOKENS), not the context's end.
    bounded = cbserve("complete", "The object", "--base-url", stack.base_url, "--temperature", "0")
    assert bounded.returncode == 0, bounded.stderr
    with stack.redis() as r:
        [(_, fields)] = r.xrevrange(REQUESTS_STREAM, count=1)
    assert decode_request(fields[FIELD]).sampling_params.max_tokens == DEFAULT_COMPLETE_MAX_TOKENS


def test_complete_reports_an_unreachable_server() -> None:
    from harness.processes.redis_server import free_port

    result = cbserve("complete", "x", "--base-url", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 1 and "is `cbserve up` running?" in result.stderr


def test_chat_keeps_the_conversation(stack: Stack) -> None:
    first, second = "Hello there", "And then?"
    reply1 = greedy_chat(stack.base_url, [{"role": "user", "content": first}])
    history = [
        {"role": "user", "content": first},
        {"role": "assistant", "content": reply1},
        {"role": "user", "content": second},
    ]
    reply2 = greedy_chat(stack.base_url, history)
    assert reply1 and reply2
    # The second turn must depend on the first, or this test could not tell a chat from two one-offs.
    assert reply2 != greedy_chat(stack.base_url, [{"role": "user", "content": second}])

    args = ("chat", "--base-url", stack.base_url, "--max-tokens", "8", "--temperature", "0")
    result = cbserve(*args, stdin=f"{first}\n\n{second}\n")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"{reply1}\n{reply2}\n"
    # CBSERVE_URL names the server when --base-url is not given.
    from_env = cbserve(*args[:1], *args[3:], stdin=f"{first}\n", url=stack.base_url)
    assert (from_env.returncode, from_env.stdout) == (0, f"{reply1}\n")

    # /exit ends the chat before the lines after it; a system message opens the conversation.
    result = cbserve(*args, "--system", "Be brief.", stdin=f"{first}\n/exit\n{second}\n")
    system_reply = greedy_chat(
        stack.base_url, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": first}]
    )
    assert (result.returncode, result.stdout) == (0, f"{system_reply}\n")
