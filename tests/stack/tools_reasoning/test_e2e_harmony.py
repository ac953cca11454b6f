"""gpt-oss's harmony format through the whole stack: a tiny random model whose chat template
(harness/models/templates/gpt_oss.jinja) writes tools, calls and results as harmony messages, its
markers whole tokens. The gateway picks the harmony tool and reasoning parsers from the template.

The weights are random: a forced call is valid because the grammar, in harmony messages, forced it
(the model may write an `analysis` message first); `auto` is exercised by forcing the text of a
harmony answer that calls a tool with `structured_outputs.choice` (which, as any schema, applies to
the answer's `final` message, so the call comes after it), read streamed and whole.
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

MODEL = "gpt-oss-tiny"
MARKERS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]
USER: list[dict[str, Any]] = [{"role": "user", "content": "Plan a trip."}]
WEATHER = TRIP_SCHEMA
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "now"}},
]
ARGUMENTS = {"city": "Rome", "days": 2}
# The final message's text, then a call (the grammar of `choice` writes the final header itself).
ANSWER = (
    "Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
    "<|constrain|>json<|message|>" + json.dumps(ARGUMENTS) + "<|call|>"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    template = (TEMPLATES / "gpt_oss.jinja").read_text()
    path = tmp_path_factory.mktemp("harmony-models") / MODEL
    return build_tiny_model(path, max_len=2048, chat_template=template, added_tokens=MARKERS)


stack = module_stack("harmony-stack", "model_dir")


@pytest.fixture(scope="module")
def bias(model_dir: Path) -> dict[str, float]:
    """Close an analysis message after ten tokens or so (a random model's odds)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return {str(tokenizer.convert_tokens_to_ids("<|end|>")): 4.0}


def _ask(client: openai.OpenAI, **params: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, **params)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_a_forced_call_follows_the_schema(
    client: openai.OpenAI, bias: dict[str, float], tool_choice: Any
) -> None:
    params: dict[str, Any] = {
        "logit_bias": bias,
        "tool_choice": tool_choice,
        "parallel_tool_calls": False,
        "temperature": 1.0,
        "seed": 1,
        "n": 2,
        "max_tokens": 200,
    }
    answer = _ask(client, **params)
    streamed = sdk_stream(_ask(client, **params, stream=True))
    for choice in answer.choices:
        call = forced_call(choice)
        assert choice.message.content is None
        reasoning = getattr(choice.message, "reasoning_content", None) or ""
        assert "<|" not in reasoning
        if tool_choice != "required":
            assert call.function.name == "get_weather"
        schema = WEATHER if call.function.name == "get_weather" else {"type": "object", "maxProperties": 0}
        jsonschema.validate(json.loads(call.function.arguments), schema)
        got = streamed[choice.index]
        assert (got["reasoning"], got["content"], got["finish"]) == (reasoning, "", "tool_calls")
        assert [c[1:] for c in got["calls"].values()] == [[call.function.name, call.function.arguments]]


def test_auto_reads_a_call_after_the_answer_streamed_and_whole(
    client: openai.OpenAI, bias: dict[str, float]
) -> None:
    body: dict[str, Any] = {
        "logit_bias": bias,
        "temperature": 0.0,
        "max_tokens": 300,
        "extra_body": {"structured_outputs": {"choice": [ANSWER]}},
    }
    answer = _ask(client, **body)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGUMENTS
    reasoning = getattr(choice.message, "reasoning_content", None) or ""
    details = answer.usage.completion_tokens_details
    assert (details.reasoning_tokens if details else 0) > 0 or not reasoning
    streamed = sdk_stream(_ask(client, **body, stream=True))[0]
    assert (streamed["reasoning"], streamed["content"], streamed["finish"]) == (
        reasoning,
        "Checking.",
        "tool_calls",
    )
    assert [c[1:] for c in streamed["calls"].values()] == [["get_weather", call.function.arguments]]


def test_history_renders_through_the_harmony_template(client: openai.OpenAI, model_dir: Path) -> None:
    call: dict[str, Any] = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)},
    }
    messages: list[dict[str, Any]] = [
        *USER,
        {"role": "assistant", "content": None, "reasoning_content": "Rome, 2 days.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=1)  # type: ignore[arg-type]
    hf = AutoTokenizer.from_pretrained(model_dir)
    tools: list[Any] = TOOLS
    history = [
        *messages[:1],
        {**messages[1], "tool_calls": [{**call, "function": {**call["function"], "arguments": ARGUMENTS}}]},
        messages[2],
    ]
    text = str(hf.apply_chat_template(history, tools=tools, add_generation_prompt=True, tokenize=False))
    assert "to=functions.get_weather" in text and "<|start|>functions.get_weather to=assistant" in text
    assert "sunny" in text and text.endswith("<|start|>assistant")
    # The thoughts before the call come back as its analysis message (interleaved thinking).
    assert "<|channel|>analysis<|message|>Rome, 2 days.<|end|><|start|>assistant to=functions" in text
    expected = hf.encode(text, add_special_tokens=False)
    assert answer.usage is not None and answer.usage.prompt_tokens == len(expected)


def test_responses_count_the_analysis_tokens(client: openai.OpenAI, bias: dict[str, float]) -> None:
    thinking = []
    for seed, response, _ in schema_responses(client, MODEL, bias, range(4), WEATHER):
        assert response.usage is not None
        num_reasoning = response.usage.output_tokens_details.reasoning_tokens
        if response.output[0].type == "reasoning":
            assert 0 < num_reasoning < response.usage.output_tokens
            thinking.append(seed)
        else:
            assert num_reasoning == 0
    assert thinking


def test_only_an_assistant_carries_thoughts(client: openai.OpenAI) -> None:
    messages = [{**USER[0], "reasoning_content": "hm"}]
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)  # type: ignore[arg-type]
    assert error.value.body["param"] == "messages[0].reasoning_content"  # type: ignore[index]
