"""The curl, OpenAI and Anthropic SDK examples of the README and docs/api.md, run verbatim against a
live stack serving the shipped demo model (`models/demo`), as `make run` serves it.

Each answer is checked against the same request sent with httpx, not only for its shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.readme_examples import example, run_example
from tests.harness.services import ROOT, Stack, running_stack

README = ROOT / "README.md"
API_DOC = ROOT / "docs" / "api.md"  # the examples beyond the README's one per client kind
DEMO_DIR = ROOT / "models" / "demo"  # served as `demo`, its directory's name
QUESTION = [{"role": "user", "content": "What is the assert statement?"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("readme-examples"), DEMO_DIR) as stack:
        yield stack


def run(stack: Stack, name: str, lang: str, doc: Path = README) -> str:
    return run_example(example(doc, name, lang), {"CBSERVE_URL": stack.base_url}, lang)


def post(stack: Stack, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(f"{stack.base_url}{path}", json={"model": "demo", "temperature": 0, **body}, timeout=60)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def counts(usage: dict[str, Any]) -> tuple[int, int, int]:
    """Usage less its cached tokens: the second of two equal prompts finds the first one's cached."""
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]


def test_curl_chat_stream_example(stack: Stack) -> None:
    out = run(stack, "curl-chat-stream", "bash")
    events = [line.removeprefix("data: ") for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    expected = post(stack, "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 32})
    assert text == expected["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"] == [] and counts(chunks[-1]["usage"]) == counts(expected["usage"])


def test_curl_completion_example(stack: Stack) -> None:
    answer = json.loads(run(stack, "curl-completion", "bash", API_DOC))
    expected = post(stack, "/v1/completions", {"prompt": "The import statement", "max_tokens": 24})
    assert answer["object"] == "text_completion" and answer["model"] == "demo"
    assert answer["choices"][0]["text"] == expected["choices"][0]["text"]
    assert counts(answer["usage"]) == counts(expected["usage"])


def test_openai_sdk_example(stack: Stack) -> None:
    out = run(stack, "openai-sdk", "python")
    expected = post(stack, "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 32})
    assert out == expected["choices"][0]["message"]["content"] + "\n"


def test_openai_sdk_async_example(stack: Stack) -> None:
    out = run(stack, "openai-sdk-async", "python", API_DOC)
    prompts = ["The import statement", "The for loop", "Python is", "A class definition"]
    expected = [
        f"{p!r} -> {post(stack, '/v1/completions', {'prompt': p, 'max_tokens': 24})['choices'][0]['text']!r}"
        for p in prompts
    ]
    assert out.splitlines() == expected


def test_anthropic_sdk_example(stack: Stack) -> None:
    out = run(stack, "anthropic-sdk", "python", API_DOC)
    system = [{"role": "system", "content": "You answer questions about Python."}]
    expected = post(stack, "/v1/chat/completions", {"messages": system + QUESTION, "max_tokens": 32})
    text, usage = out.rsplit("\n", 2)[:2]
    assert text == expected["choices"][0]["message"]["content"]
    assert f"input_tokens={expected['usage']['prompt_tokens']}" in usage
    assert f"output_tokens={expected['usage']['completion_tokens']}" in usage


def test_structured_output_example(stack: Stack) -> None:
    """Sampled at temperature 1, the demo model's Pet is whole JSON within max_tokens every time: the
    schema's bounded strings, not luck (unbounded, it runs out of tokens mid-string)."""
    for _ in range(3):
        pet, choice = run(stack, "structured-output", "python", API_DOC).splitlines()
        assert re.fullmatch(r"Pet\(name='[A-Za-z ]{1,12}', kind='[A-Za-z ]{1,12}'\)", pet), pet
        assert choice in ("yes", "no")
