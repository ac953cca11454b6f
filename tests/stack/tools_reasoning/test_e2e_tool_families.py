"""Tool calls in each family's own format, through the whole stack: a tiny random model per family,
whose chat template (harness/models/templates/) writes tools and calls as that family does; the
gateway picks the format from the template.

The weights are random: a forced call is valid because the grammar, in the family's format, forced
it; `auto` is exercised by forcing the text of a call with `structured_outputs.choice`, which the
family's parser then reads like any model's output, streamed and whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from harness.gateway.parsed_deltas import forced_call, sdk_stream
from harness.models.tiny_model import TEMPLATES, build_tiny_model
from harness.processes.services import Stack, running_stack

USER = [{"role": "user", "content": "Plan a trip."}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "note": {"type": "string", "pattern": "^[a-z]{1,6}$"},
    },
    "required": ["city", "days", "note"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "now"}},
]
# Per family: the text of a call to get_weather(city="Rome", days=2, note="hi") as its model writes it.
ARGUMENTS = {"city": "Rome", "days": 2, "note": "hi"}
_JSON = json.dumps(ARGUMENTS)
CALL_TEXTS = {
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": ' + _JSON + "}",
    "pythonic": '[get_weather(city="Rome", days=2, note="hi")]',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + _JSON + "}]",
    "qwen3_xml": "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n<parameter=note>\nhi\n</parameter>\n</function>\n</tool_call>",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    + _JSON
    + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
}


@pytest.fixture(scope="module", params=sorted(CALL_TEXTS))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def family_model_dir(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    template = (TEMPLATES / f"{family}.jinja").read_text()
    path = tmp_path_factory.mktemp("family-models") / family
    return build_tiny_model(path, max_len=2048, chat_template=template)


@pytest.fixture(scope="module")
def stack(family_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("family-stack"), family_model_dir) as s:
        yield s


def _ask(client: openai.OpenAI, family: str, **params: Any) -> Any:
    return client.chat.completions.create(model=family, messages=USER, tools=TOOLS, **params)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_a_forced_call_follows_the_schema(client: openai.OpenAI, family: str, tool_choice: Any) -> None:
    answer = _ask(
        client,
        family,
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        temperature=1.0,
        seed=1,
        n=2,
        max_tokens=200,
    )
    for choice in answer.choices:
        call = forced_call(choice)
        assert choice.message.content is None
        if tool_choice != "required":
            assert call.function.name == "get_weather"
        schema = WEATHER if call.function.name == "get_weather" else {"type": "object", "maxProperties": 0}
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_auto_reads_the_family_s_calls_streamed_and_whole(client: openai.OpenAI, family: str) -> None:
    text = CALL_TEXTS[family]
    body: dict[str, Any] = {
        "temperature": 0.0,
        "max_tokens": 300,
        "extra_body": {"structured_outputs": {"choice": [text]}},
    }
    choice = _ask(client, family, **body).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGUMENTS
    streamed = sdk_stream(_ask(client, family, **body, stream=True))[0]
    assert streamed["finish"] == "tool_calls" and streamed["content"] == ""
    assert [c[1:] for c in streamed["calls"].values()] == [["get_weather", call.function.arguments]]


def test_history_renders_through_the_family_template(
    client: openai.OpenAI, family: str, family_model_dir: Path
) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)},
    }
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    answer = client.chat.completions.create(model=family, messages=messages, tools=TOOLS, max_tokens=1)  # type: ignore[arg-type]
    hf = AutoTokenizer.from_pretrained(family_model_dir)
    history = [
        *messages[:1],
        {**messages[1], "tool_calls": [{**call, "function": {**call["function"], "arguments": ARGUMENTS}}]},
        messages[2],
    ]
    text = hf.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert "Rome" in text and "sunny" in text  # the call and its result, as the family writes them
    expected = hf.encode(text, add_special_tokens=False)
    assert answer.usage is not None and answer.usage.prompt_tokens == len(expected)
