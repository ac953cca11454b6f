"""Tool-use conversations for the demo model (scripts/train_demo_model.py), rendered by the chat
template the server uses, so that `make run` shows tool calling: three tools (the weather in a city,
a search of the Python documentation, adding two numbers), called alone or two at a time, their
results in `<tool_response>` turns, and a final answer built from them; plus turns where tools are
offered and the question needs none.
"""

from __future__ import annotations

import json
import random
from typing import Any

from openai_frontend.model.chat_template import render_chat
from openai_frontend.model.chatml import CHAT_TEMPLATE


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


WEATHER = _function(
    "get_weather",
    "Get the current weather in a city.",
    {
        "city": {"type": "string", "description": "The name of the city."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    ["city"],
)
SEARCH = _function(
    "search_docs",
    "Search the Python documentation.",
    {"query": {"type": "string", "description": "What to look for."}},
    ["query"],
)
ADD = _function(
    "add",
    "Add two numbers.",
    {"a": {"type": "number"}, "b": {"type": "number"}},
    ["a", "b"],
)
TOOLS = [WEATHER, SEARCH, ADD]

CITIES = [
    "Paris", "London", "Berlin", "Rome", "Madrid", "Lisbon", "Vienna", "Prague", "Oslo", "Dublin",
    "Tokyo", "Seoul", "Delhi", "Cairo", "Lagos", "Nairobi", "Lima", "Bogota", "Toronto", "Chicago",
    "Boston", "Denver", "Sydney", "Perth", "Athens", "Warsaw", "Zurich", "Amsterdam", "Helsinki", "Mumbai",
]  # fmt: skip
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowing", "foggy"]
WEATHER_QUESTIONS = [
    "What is the weather in {city}?",
    "What's the weather like in {city} today?",
    "How warm is it in {city}?",
    "Is it cold in {city}?",
]
UNIT_QUESTIONS = ["What is the temperature in {city} in {unit}?", "How warm is it in {city}, in {unit}?"]
PAIR_QUESTIONS = ["What is the weather in {a} and in {b}?", "Compare the weather in {a} and {b}."]
SEARCH_QUESTIONS = [
    "Search the docs for {topic}.",
    "Look up {topic} in the Python documentation.",
    "Find {topic} in the docs.",
]
ADD_QUESTIONS = ["What is {a} plus {b}?", "Add {a} and {b}.", "What is the sum of {a} and {b}?"]


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _render(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    return render_chat(CHAT_TEMPLATE, messages, special_tokens={}, add_generation_prompt=False, tools=tools)


def _offered(needed: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """The tools offered: the needed ones and some others, in a random order."""
    others = [t for t in TOOLS if t not in needed]
    offered = needed + rng.sample(others, rng.randint(0, len(others)))
    rng.shuffle(offered)
    return offered


def _weather(city: str, unit: str, rng: random.Random) -> tuple[dict[str, Any], str]:
    degrees = rng.randint(-5, 35) if unit == "celsius" else rng.randint(23, 95)
    report = {"city": city, "temperature": degrees, "unit": unit, "conditions": rng.choice(CONDITIONS)}
    sentence = f"It is {degrees} degrees {unit} and {report['conditions']} in {city}."
    return report, sentence


def _conversation(
    question: str,
    calls: list[tuple[str, dict[str, Any], str]],  # (tool name, arguments, result)
    answer: str,
    tools: list[dict[str, Any]],
) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    if calls:
        messages.append(
            {"role": "assistant", "content": "", "tool_calls": [_call(n, a) for n, a, _ in calls]}
        )
        messages += [{"role": "tool", "content": result} for _, _, result in calls]
    messages.append({"role": "assistant", "content": answer})
    return _render(messages, tools)


def tool_samples(answers: dict[str, str], rng: random.Random) -> list[str]:
    """Rendered conversations; `answers` maps a documentation topic to what a search of it returns."""
    samples: list[str] = []
    for city in CITIES:
        for template in rng.sample(WEATHER_QUESTIONS, 2):
            report, sentence = _weather(city, "celsius", rng)
            calls = [("get_weather", {"city": city}, json.dumps(report))]
            samples.append(
                _conversation(template.format(city=city), calls, sentence, _offered([WEATHER], rng))
            )
        unit = rng.choice(["celsius", "fahrenheit"])
        report, sentence = _weather(city, unit, rng)
        calls = [("get_weather", {"city": city, "unit": unit}, json.dumps(report))]
        question = rng.choice(UNIT_QUESTIONS).format(city=city, unit=unit)
        samples.append(_conversation(question, calls, sentence, _offered([WEATHER], rng)))
        other = rng.choice([c for c in CITIES if c != city])
        (first, one), (second, two) = _weather(city, "celsius", rng), _weather(other, "celsius", rng)
        calls = [
            ("get_weather", {"city": city}, json.dumps(first)),
            ("get_weather", {"city": other}, json.dumps(second)),
        ]
        question = rng.choice(PAIR_QUESTIONS).format(a=city, b=other)
        samples.append(_conversation(question, calls, f"{one} {two}", _offered([WEATHER], rng)))
    for topic in rng.sample(sorted(answers), min(40, len(answers))):
        question = rng.choice(SEARCH_QUESTIONS).format(topic=topic)
        calls = [("search_docs", {"query": topic}, answers[topic])]
        samples.append(_conversation(question, calls, answers[topic], _offered([SEARCH], rng)))
    for _ in range(40):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        calls = [("add", {"a": a, "b": b}, str(a + b))]
        answer = f"{a} plus {b} is {a + b}."
        samples.append(
            _conversation(rng.choice(ADD_QUESTIONS).format(a=a, b=b), calls, answer, _offered([ADD], rng))
        )
    return samples


def no_tool_samples(chats: list[tuple[str, str]], rng: random.Random) -> list[str]:
    """Questions that need no tool, asked with tools offered: answered as without them."""
    return [_conversation(q, [], a, _offered([], rng) or [rng.choice(TOOLS)]) for q, a in chats]
