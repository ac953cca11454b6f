"""A model that thinks, through the whole stack: a tiny random model whose chat template
(harness/models/templates/think.jinja, Qwen3's way) has it think in `<think>` … `</think>`, both whole
tokens. The gateway picks the `think` reasoning parser from the template.

The weights are random, so the tests steer them: a logit bias makes the model open its thoughts and,
a few tokens later, close them; the JSON schema that follows is honoured because the grammar lets
thoughts run free until `</think>` and applies to the answer only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from harness.gateway.parsed_deltas import forced_call, sdk_stream
from harness.gateway.trip_schema import TRIP_SCHEMA, schema_responses
from harness.models.tiny_model import TEMPLATES, build_tiny_model
from harness.processes.services import module_stack

MODEL = "thinker"
USER = [{"role": "user", "content": "Where to?"}]
SCHEMA = TRIP_SCHEMA
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def thinker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    template = (TEMPLATES / "think.jinja").read_text()
    path = tmp_path_factory.mktemp("reasoning-models") / MODEL
    return build_tiny_model(path, max_len=1024, chat_template=template, added_tokens=["<think>", "</think>"])


stack = module_stack("reasoning-stack", "thinker_dir")


@pytest.fixture(scope="module")
def bias(thinker_dir: Path) -> dict[str, float]:
    """Open the thoughts at once; close them after ten tokens or so (a random model's odds)."""
    tokenizer = AutoTokenizer.from_pretrained(thinker_dir)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>")}
    return {str(ids["<think>"]): 30.0, str(ids["</think>"]): 4.0}


def _ask(client: openai.OpenAI, bias: dict[str, float], **params: Any) -> Any:
    params = {"max_tokens": 200, **params}
    return client.chat.completions.create(model=MODEL, messages=USER, logit_bias=bias, **params)  # type: ignore[arg-type]


def test_a_schema_applies_after_the_thoughts(client: openai.OpenAI, bias: dict[str, float]) -> None:
    answer = _ask(client, bias, response_format=JSON_SCHEMA, temperature=1.0, seed=0, n=4)
    thoughts = []
    for choice in answer.choices:
        assert choice.finish_reason == "stop", choice.message
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        reasoning = getattr(choice.message, "reasoning_content", None)
        assert reasoning is None or ("<think>" not in reasoning and "</think>" not in reasoning)
        thoughts.append(reasoning)
    assert any(thoughts), thoughts
    details = answer.usage.completion_tokens_details
    assert details is not None and 0 < details.reasoning_tokens < answer.usage.completion_tokens


def test_streamed_thoughts_join_to_the_answer(client: openai.OpenAI, bias: dict[str, float]) -> None:
    params: dict[str, Any] = {"response_format": JSON_SCHEMA, "temperature": 1.0, "seed": 3, "n": 4}
    answer = _ask(client, bias, **params)
    streamed = sdk_stream(_ask(client, bias, **params, stream=True))
    for choice in answer.choices:
        got = streamed[choice.index]
        reasoning = getattr(choice.message, "reasoning_content", None) or ""
        assert (got["reasoning"], got["content"], got["finish"]) == (
            reasoning,
            choice.message.content,
            "stop",
        )
    assert any(got["reasoning"] for got in streamed.values())


def test_a_forced_call_comes_after_the_thoughts(client: openai.OpenAI, bias: dict[str, float]) -> None:
    tools = [{"type": "function", "function": {"name": "book", "parameters": SCHEMA}}]
    answer = _ask(
        client,
        bias,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        seed=2,
        n=3,
    )
    for choice in answer.choices:
        jsonschema.validate(json.loads(forced_call(choice).function.arguments), SCHEMA)
    assert any(getattr(c.message, "reasoning_content", None) for c in answer.choices)


def test_thinking_turned_off_by_the_template(client: openai.OpenAI, bias: dict[str, float]) -> None:
    """enable_thinking false: the template writes the thoughts empty; what follows is all answer."""
    answer = _ask(
        client,
        bias,
        temperature=0.0,
        max_tokens=8,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    message = answer.choices[0].message
    assert getattr(message, "reasoning_content", None) is None and message.content
    assert answer.usage.completion_tokens_details is None


def test_responses_give_a_reasoning_item(client: openai.OpenAI, bias: dict[str, float]) -> None:
    # The seeds whose answer thinks, then answers (a random model's odds: most of them).
    thinking = []
    for seed, response, params in schema_responses(client, MODEL, bias, range(6), SCHEMA):
        if response.output[0].type != "reasoning":
            assert [item.type for item in response.output] == ["message"]
            continue
        reasoning, message = response.output
        thoughts = reasoning.content[0].text  # type: ignore[union-attr, index]
        assert message.type == "message" and "</think>" not in thoughts
        events = list(client.responses.create(**params, stream=True))
        deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
        assert "".join(deltas) == thoughts
        thinking.append(seed)
    assert thinking
