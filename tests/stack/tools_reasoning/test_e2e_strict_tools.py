"""`tool_choice` auto with a strict function, against the demo model (trained to call tools): the
text stays free, and every call the model opens follows the function's schema, here one that needs
a `unit` the model does not write on its own. The OpenAI Agents SDK sends its tools this way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from harness.processes.services import running_stack

DEMO_DIR = Path(__file__).resolve().parents[3] / "models" / "demo"
QUESTION = [{"role": "user", "content": "What is the weather in Tokyo?"}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}


def weather_tool(strict: bool) -> dict[str, Any]:
    function = {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": SCHEMA,
    }
    return {"type": "function", "function": {**function, "strict": strict}}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with running_stack(tmp_path_factory.mktemp("strict-tools"), DEMO_DIR) as stack, stack.sdk() as c:
        yield c


def calls_of(client: openai.OpenAI, strict: bool, **params: Any) -> list[dict[str, Any]]:
    answer = client.chat.completions.create(
        model="demo",
        messages=QUESTION,
        tools=[weather_tool(strict)],
        max_tokens=80,
        **params,  # type: ignore[arg-type]
    )
    calls = answer.choices[0].message.tool_calls or []
    assert all(c.function.name == "get_weather" for c in calls)  # type: ignore[union-attr]
    return [json.loads(c.function.arguments) for c in calls]  # type: ignore[union-attr]


def test_unforced_calls_follow_a_strict_schema(client: openai.OpenAI) -> None:
    # Left to itself the model writes {"city": ...} only: the schema is not followed.
    loose = calls_of(client, strict=False, temperature=0)
    assert loose and "unit" not in loose[0]
    made = 0
    for seed in range(6):
        for arguments in calls_of(client, strict=True, temperature=1.0, seed=seed):
            jsonschema.validate(arguments, SCHEMA)
            made += 1
    assert made >= 3  # the model did call (auto leaves it free not to)


def test_text_stays_free(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Hello"}],
        tools=[weather_tool(strict=True)],  # type: ignore[list-item]
        temperature=0,
        max_tokens=40,
    )
    message = answer.choices[0].message
    assert message.tool_calls is None and message.content and message.content.startswith("Hello")
