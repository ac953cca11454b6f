"""Structured outputs through the whole stack, with the official `openai` SDK: the tiny model's weights
are random, so every output that parses and validates does so because the worker's grammar forced it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
import redis
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from common.streams import REQUESTS_STREAM
from harness.processes.services import Stack, module_stack

USER = [{"role": "user", "content": "Describe a pet as JSON."}]
SEEDS = range(3)
# Nesting, enums, arrays, optional properties, a pattern, bounded numbers; all of them terminate.
SCHEMAS: dict[str, dict[str, Any]] = {
    "pet": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
            "kind": {"enum": ["cat", "dog", "owl"]},
            "tags": {"type": "array", "items": {"enum": ["small", "loud"]}, "maxItems": 3},
            "size": {
                "type": "object",
                "properties": {
                    "tall": {"type": "boolean"},
                    "legs": {"type": "integer", "minimum": 0, "maximum": 8},
                },
                "required": ["tall"],
            },
            "note": {"type": "string", "maxLength": 5},
        },
        "required": ["name", "kind", "tags", "size"],
    },
    "list": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99}, "ok": {"type": "boolean"}},
            "required": ["id"],
        },
        "minItems": 1,
        "maxItems": 3,
    },
    "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
}


class Size(BaseModel):
    tall: bool


class Pet(BaseModel):
    name: str = Field(pattern=r"^[a-z]{1,6}$")
    kind: Literal["cat", "dog"]
    tags: list[Literal["small", "loud"]] = Field(max_length=2)
    size: Size
    age: int | None = Field(ge=0, le=20)


stack = module_stack("so-stack")


def json_schema_format(name: str) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_sampled_json_always_validates(client: openai.OpenAI, name: str) -> None:
    for seed in SEEDS:
        answer = client.chat.completions.create(
            model="tiny-llama",
            messages=USER,  # type: ignore[arg-type]
            response_format=json_schema_format(name),  # type: ignore[arg-type]
            temperature=1.0,
            seed=seed,
            n=2,  # choices use seed + i: two more samples each
            max_tokens=200,
        )
        for choice in answer.choices:
            assert choice.finish_reason == "stop", choice.message.content  # the grammar ended it
            jsonschema.validate(json.loads(choice.message.content or ""), SCHEMAS[name])


def test_json_object_and_the_same_seed_twice(client: openai.OpenAI, tiny_model_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    # Keys and values are free text, which a random model seldom closes: favour closing quotes and braces.
    closing = {str(tokenizer.token_to_id(c)): 4.0 for c in '"}'}

    def sample() -> str:
        answer = client.chat.completions.create(
            model="tiny-llama",
            messages=USER,  # type: ignore[arg-type]
            response_format={"type": "json_object"},
            temperature=1.0,
            seed=11,
            max_tokens=200,
            logit_bias=closing,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(json.loads(choice.message.content or ""), dict)
        return choice.message.content or ""

    assert sample() == sample()


def test_sdk_parse_returns_the_pydantic_object(client: openai.OpenAI) -> None:
    for seed in SEEDS:
        completion = client.chat.completions.parse(
            model="tiny-llama",
            messages=USER,
            response_format=Pet,
            temperature=1.0,
            seed=seed,
            max_tokens=200,  # type: ignore[arg-type]
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Pet)


def test_streamed_json_with_logprobs_validates(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny-llama",
        messages=USER,  # type: ignore[arg-type]
        response_format=json_schema_format("pet"),  # type: ignore[arg-type]
        temperature=1.0,
        seed=5,
        max_tokens=200,
        stream=True,
        logprobs=True,
        top_logprobs=2,
    )
    text, finish, num_logprobs = "", None, 0
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            num_logprobs += len(choice.logprobs.content or []) if choice.logprobs else 0
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS["pet"])
    assert num_logprobs > 0


@pytest.mark.parametrize(
    ("constraint", "pattern"),
    [
        ({"regex": "[a-z]{3,6}@[a-z]{2,4}\\.(com|org)"}, r"[a-z]{3,6}@[a-z]{2,4}\.(com|org)"),
        ({"choice": ["yes", "no", "maybe so"]}, r"yes|no|maybe so"),
        (
            {"grammar": 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'},
            r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)",
        ),
        ({"json": json.dumps(SCHEMAS["code"])}, r'"[A-Z]{2}-[0-9]{3}"'),
    ],
    ids=["regex", "choice", "grammar", "json-text"],
)
def test_completions_follow_regex_choice_and_grammar(
    client: openai.OpenAI, constraint: dict[str, Any], pattern: str
) -> None:
    answer = client.completions.create(
        model="tiny-llama",
        prompt="The answer:",
        temperature=1.0,
        seed=3,
        n=4,
        max_tokens=100,
        extra_body={"structured_outputs": constraint},
    )
    for choice in answer.choices:
        assert choice.finish_reason == "stop", choice.text
        assert re.fullmatch(pattern, choice.text), choice.text


def test_a_stop_string_still_cuts_the_output(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model="tiny-llama",
        prompt="The answer:",
        max_tokens=50,
        temperature=0.0,
        stop=["c"],
        extra_body={"structured_outputs": {"regex": "ab{1,5}c{2}"}},
    )
    (choice,) = answer.choices
    assert choice.finish_reason == "stop"
    assert re.fullmatch("ab{1,5}", choice.text), choice.text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "chat",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objec"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            "chat",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ("chat", {"response_format": {"type": "yaml"}}, "response_format.type"),
        ("completions", {"structured_outputs": {"regex": "(a"}}, "structured_outputs.regex"),
        ("completions", {"structured_outputs": {"regex": "(?<=a)b"}}, "structured_outputs.regex"),
        (
            "completions",
            {"structured_outputs": {"grammar": "root ::= missing"}},
            "structured_outputs.grammar",
        ),
        ("completions", {"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ("completions", {"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ("completions", {"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        (
            "completions",
            {"structured_outputs": {"whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
        ),
        (
            "chat",
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
        ),
    ],
)
def test_a_grammar_that_cannot_be_enforced_is_refused_before_queuing(
    stack: Stack, path: str, body: dict[str, Any], param: str
) -> None:
    base = {"messages": USER} if path == "chat" else {"prompt": "hi"}
    queued = redis.Redis.from_url(stack.redis_url).xlen(REQUESTS_STREAM)
    url = f"{stack.base_url}/v1/{'chat/completions' if path == 'chat' else 'completions'}"
    response = httpx.post(url, json={**base, **body}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error
    assert redis.Redis.from_url(stack.redis_url).xlen(REQUESTS_STREAM) == queued
