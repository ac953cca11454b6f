"""The first ten minutes: every marked example of the README and docs/, run verbatim as the README says
to run it. The venv is made by the Makefile's own target (`make install-serve`, as `make run` makes
`.venv`; harness/user/readme_venv.py), the stack is `make run` itself serving the shipped demo model,
the environment is what `source .cbserve/env` exports, and the Python examples run with that venv's
interpreter: what the dev venv alone holds (the test toolchain) is never there.

Each answer is checked against the same request sent with httpx, not only for its shape.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from harness.processes.services import ROOT
from harness.user.make_run import MadeRun, make_run
from harness.user.readme_examples import example, examples_in, run_example
from harness.user.readme_venv import readme_venv, user_env

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
API_DOC = ROOT / "docs" / "api.md"  # the examples beyond the README's one per client kind
PROTOCOL_DOC = ROOT / "docs" / "protocol.md"
QUESTION = [{"role": "user", "content": "What is the assert statement?"}]
TOKENS_PROMPT = [1, 17, 42, 99]  # the queue clients' examples' prompt, 8 greedy tokens


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MadeRun]:
    venv = readme_venv()
    with make_run(venv, tmp_path_factory.mktemp("readme-examples") / "run") as made:
        yield made


def run(stack: MadeRun, name: str, lang: str, doc: Path = README) -> str:
    """The example run as a user runs it: in a shell that sourced the run's env file, with the venv's
    Python for Python code."""
    return run_example(example(doc, name, lang), stack.env, lang, python=stack.python, base_env=user_env())


def post(stack: MadeRun, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(f"{stack.base_url}{path}", json={"model": "demo", "temperature": 0, **body}, timeout=60)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def counts(usage: dict[str, Any]) -> tuple[int, int, int]:
    """Usage less its cached tokens: the second of two equal prompts finds the first one's cached."""
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]


def greedy_token_ids(stack: MadeRun, ignore_eos: bool = False) -> list[int]:
    body = {"prompt": TOKENS_PROMPT, "max_tokens": 8, "return_token_ids": True, "ignore_eos": ignore_eos}
    return list(post(stack, "/v1/completions", body)["choices"][0]["token_ids"])


# Every marked example and the test below that runs it: a new example fails here until it is run.
RUN_BY = {
    "curl-chat-stream": "test_curl_chat_stream_example",
    "openai-sdk": "test_openai_sdk_example",
    "stream-client": "test_stream_client_example",
    "celery": "test_celery_example",
    "batch-api": "test_batch_api_example",
    "offline-llm": "test_offline_llm_example",
    "curl-completion": "test_curl_completion_example",
    "openai-sdk-async": "test_openai_sdk_async_example",
    "structured-output": "test_structured_output_example",
    "anthropic-sdk": "test_anthropic_sdk_example",
    "metrics": "test_metrics_example",
    "raw-protocol": "test_raw_protocol_example",
}


def test_every_example_of_the_docs_is_run_here() -> None:
    assert set(examples_in(DOCS)) == set(RUN_BY)
    assert all(name in globals() for name in RUN_BY.values())


def test_the_venv_holds_the_examples_sdks_and_no_test_tool(stack: MadeRun) -> None:
    modules = ("openai", "anthropic", "pytest")
    code = f"import importlib.util as u; print([u.find_spec(m) is not None for m in {modules}])"
    done = subprocess.run([stack.python, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[True, True, False]"


def test_curl_chat_stream_example(stack: MadeRun) -> None:
    out = run(stack, "curl-chat-stream", "bash")
    events = [line.removeprefix("data: ") for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    expected = post(stack, "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 32})
    assert text == expected["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"] == [] and counts(chunks[-1]["usage"]) == counts(expected["usage"])


def test_cli_complete_example(stack: MadeRun) -> None:
    """`.venv/bin/cbserve complete "The import statement"`: sampled, so only its shape is known."""
    done = subprocess.run(
        [stack.venv / "bin" / "cbserve", "complete", "The import statement"],
        cwd=ROOT,
        env={**user_env(), **stack.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n") and done.stdout.strip(), done.stdout


def test_openai_sdk_example(stack: MadeRun) -> None:
    out = run(stack, "openai-sdk", "python")
    expected = post(stack, "/v1/chat/completions", {"messages": QUESTION, "max_tokens": 32})
    assert out == expected["choices"][0]["message"]["content"] + "\n"


def test_stream_client_example(stack: MadeRun) -> None:
    assert run(stack, "stream-client", "python").strip() == str(greedy_token_ids(stack))


def test_celery_example(stack: MadeRun) -> None:
    """`make run` started the Celery worker the task needs."""
    assert run(stack, "celery", "python").strip() == str(greedy_token_ids(stack))


def test_batch_api_example(stack: MadeRun) -> None:
    status, *lines = run(stack, "batch-api", "python").splitlines()
    assert status == "completed BatchRequestCounts(completed=2, failed=0, total=2)"
    questions = ["What is the assert statement?", "Explain the for statement."]
    expected = {
        f"question-{i}": post(
            stack, "/v1/chat/completions", {"messages": [{"role": "user", "content": q}], "max_tokens": 32}
        )["choices"][0]["message"]["content"]
        for i, q in enumerate(questions)
    }
    assert dict(line.split(" ", 1) for line in lines) == expected


def test_offline_llm_example(stack: MadeRun) -> None:
    """`LLM` in the example's own process answers as the served pipeline does."""
    out = run(stack, "offline-llm", "python")
    params = {"max_tokens": 32}
    texts = [
        f"{p!r} -> {post(stack, '/v1/completions', {'prompt': p, **params})['choices'][0]['text']!r}"
        for p in ["The import statement", "The for loop"]
    ]
    chat = post(stack, "/v1/chat/completions", {"messages": QUESTION, **params})
    assert out == "\n".join([*texts, chat["choices"][0]["message"]["content"]]) + "\n"


def test_curl_completion_example(stack: MadeRun) -> None:
    answer = json.loads(run(stack, "curl-completion", "bash", API_DOC))
    expected = post(stack, "/v1/completions", {"prompt": "The import statement", "max_tokens": 24})
    assert answer["object"] == "text_completion" and answer["model"] == "demo"
    assert answer["choices"][0]["text"] == expected["choices"][0]["text"]
    assert counts(answer["usage"]) == counts(expected["usage"])


def test_openai_sdk_async_example(stack: MadeRun) -> None:
    out = run(stack, "openai-sdk-async", "python", API_DOC)
    prompts = ["The import statement", "The for loop", "Python is", "A class definition"]
    expected = [
        f"{p!r} -> {post(stack, '/v1/completions', {'prompt': p, 'max_tokens': 24})['choices'][0]['text']!r}"
        for p in prompts
    ]
    assert out.splitlines() == expected


def test_anthropic_sdk_example(stack: MadeRun) -> None:
    out = run(stack, "anthropic-sdk", "python", API_DOC)
    system = [{"role": "system", "content": "You answer questions about Python."}]
    expected = post(stack, "/v1/chat/completions", {"messages": system + QUESTION, "max_tokens": 32})
    text, usage = out.rsplit("\n", 2)[:2]
    assert text == expected["choices"][0]["message"]["content"]
    assert f"input_tokens={expected['usage']['prompt_tokens']}" in usage
    assert f"output_tokens={expected['usage']['completion_tokens']}" in usage


def test_structured_output_example(stack: MadeRun) -> None:
    """Sampled at temperature 1, the demo model's Pet is whole JSON within max_tokens every time: the
    schema's bounded strings, not luck (unbounded, it runs out of tokens mid-string)."""
    for _ in range(3):
        pet, choice = run(stack, "structured-output", "python", API_DOC).splitlines()
        assert re.fullmatch(r"Pet\(name='[A-Za-z ]{1,12}', kind='[A-Za-z ]{1,12}'\)", pet), pet
        assert choice in ("yes", "no")


# Greedy requests of the demo model that wrote one string or number until the context was full
# (max_tokens left to its default, as the llm CLI leaves it) before json_closing.py.
PET = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
    "required": ["name", "kind"],
}  # what `llm --schema 'name, kind'` sends
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "hobbies": {"type": "array"}},
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


UNBOUNDED = {
    "pet": ("Hello", schema_format(PET), PET),
    "person": ("A pet, as JSON", schema_format(PERSON), PERSON),
    "object": ("Give me a person as JSON.", {"type": "json_object"}, {"type": "object"}),
}


@pytest.mark.parametrize("name", UNBOUNDED)
def test_structured_output_without_max_tokens_stops(stack: MadeRun, name: str) -> None:
    prompt, response_format, schema = UNBOUNDED[name]
    messages = [{"role": "user", "content": prompt}]
    answer = post(stack, "/v1/chat/completions", {"messages": messages, "response_format": response_format})
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop", answer
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_metrics_example(stack: MadeRun) -> None:
    """The gateway's and the batcher's metrics, without the comment lines."""
    lines = run(stack, "metrics", "bash", API_DOC).splitlines()
    assert lines and all(line.startswith("cbserve:") for line in lines), lines
    names = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in lines}
    assert {"cbserve:generation_tokens_total", "cbserve:num_requests_running"} <= names, names


def test_raw_protocol_example(stack: MadeRun) -> None:
    out = run(stack, "raw-protocol", "python", PROTOCOL_DOC)
    assert out.strip() == f"{greedy_token_ids(stack, ignore_eos=True)} length"
