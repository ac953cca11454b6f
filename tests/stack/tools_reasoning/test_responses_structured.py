"""The Responses API's `text.format` through the whole stack, with the official `openai` SDK
(`responses.parse`, `responses.stream`): the tiny model's weights are random, so every output that
parses and validates does so because the worker's grammar forced it. A structured response is the
chat request with the same `response_format`, echoes its format, and survives `previous_response_id`
and background mode.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import redis
from tokenizers import Tokenizer

from common.streams import REQUESTS_STREAM
from harness.processes.services import Stack, module_stack, wait_for
from tests.stack.tools_reasoning.test_e2e_structured_outputs import SCHEMAS, USER, Pet, json_schema_format

PROMPT = USER[0]["content"]
SEEDS = range(10)


stack = module_stack("responses-so-stack")


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> str:
    return tiny_model_dir.name


def echo(response: Any) -> dict[str, Any]:
    """The response's `text` as the wire has it (the SDK's model names `schema` `schema_`)."""
    return dict(response.text.model_dump(by_alias=True, exclude_none=True))


def text_format(name: str) -> dict[str, Any]:
    return {"format": {"type": "json_schema", "name": name, "schema": SCHEMAS[name], "strict": True}}


def structured(client: openai.OpenAI, model: str, name: str, **fields: Any) -> Any:
    """A response to PROMPT in the format of SCHEMAS[name]; `fields` add to the request."""
    text: Any = text_format(name)
    return client.responses.create(model=model, input=PROMPT, text=text, max_output_tokens=200, **fields)


def test_sdk_parse_returns_the_pydantic_object(client: openai.OpenAI, model: str) -> None:
    for seed in SEEDS:
        response = client.responses.parse(
            model=model,
            input=PROMPT,
            text_format=Pet,
            temperature=1.0,
            max_output_tokens=200,
            extra_body={"seed": seed},
        )
        assert response.status == "completed", response.output_text
        assert isinstance(response.output_parsed, Pet)
        fmt = response.text.format  # type: ignore[union-attr]
        assert (fmt.type, fmt.name, fmt.strict) == ("json_schema", "Pet", True)  # type: ignore[union-attr]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_sampled_json_always_validates(client: openai.OpenAI, model: str, name: str) -> None:
    for seed in SEEDS:
        response = structured(client, model, name, temperature=1.0, extra_body={"seed": seed})
        assert response.status == "completed", response.output_text  # the grammar ended it
        jsonschema.validate(json.loads(response.output_text), SCHEMAS[name])
        assert echo(response) == text_format(name)


def test_a_response_is_the_chat_answer_with_the_same_format(client: openai.OpenAI, model: str) -> None:
    for name in sorted(SCHEMAS):
        response = structured(client, model, name, temperature=0)
        chat = client.chat.completions.create(
            model=model,
            messages=USER,  # type: ignore[arg-type]
            response_format=json_schema_format(name),  # type: ignore[arg-type]
            max_tokens=200,
            temperature=0,
        )
        assert response.output_text == chat.choices[0].message.content


def test_json_object_and_text(client: openai.OpenAI, model: str, tiny_model_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    # Keys and values are free text, which a random model seldom closes: favour closing quotes and braces.
    closing = {str(tokenizer.token_to_id(c)): 4.0 for c in '"}'}
    for seed in SEEDS:
        response = client.responses.create(
            model=model,
            input=PROMPT,
            text={"format": {"type": "json_object"}},
            temperature=1.0,
            max_output_tokens=200,
            extra_body={"seed": seed, "logit_bias": closing},
        )
        assert response.status == "completed", response.output_text
        assert isinstance(json.loads(response.output_text), dict)
        assert echo(response) == {"format": {"type": "json_object"}}
    greedy: dict[str, Any] = {"model": model, "input": PROMPT, "max_output_tokens": 12, "temperature": 0}
    plain = client.responses.create(**greedy, text={"format": {"type": "text"}})
    assert plain.output_text == client.responses.create(**greedy).output_text
    assert echo(plain) == {"format": {"type": "text"}}


def test_streamed_parse(client: openai.OpenAI, model: str) -> None:
    with client.responses.stream(
        model=model,
        input=PROMPT,
        text_format=Pet,
        temperature=1.0,
        max_output_tokens=200,
        extra_body={"seed": 7},
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[0].type == "response.created"
    assert events[0].response.text.format.type == "json_schema"  # type: ignore[union-attr]
    assert events[-1].type == "response.completed"
    assert isinstance(final.output_parsed, Pet)
    assert Pet.model_validate_json(text) == final.output_parsed


def test_previous_response_id_and_a_new_format(client: openai.OpenAI, model: str) -> None:
    first = client.responses.parse(
        model=model, input=PROMPT, text_format=Pet, max_output_tokens=200, temperature=0
    )
    assert isinstance(first.output_parsed, Pet)
    again = "Now a product code."
    second = client.responses.create(
        model=model,
        input=again,
        previous_response_id=first.id,
        text=text_format("code"),  # type: ignore[arg-type]
        max_output_tokens=200,
        temperature=0,
    )
    jsonschema.validate(json.loads(second.output_text), SCHEMAS["code"])
    answer = {"role": "assistant", "content": first.output_text}
    messages = [*USER, answer, {"role": "user", "content": again}]
    chat = client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        response_format=json_schema_format("code"),  # type: ignore[arg-type]
        max_tokens=200,
        temperature=0,
    )
    assert second.output_text == chat.choices[0].message.content
    # Each stored response keeps its own format.
    assert client.responses.retrieve(first.id).text.format.name == "Pet"  # type: ignore[union-attr]
    assert client.responses.retrieve(second.id).text.format.name == "code"  # type: ignore[union-attr]


def test_background_response_keeps_its_format(client: openai.OpenAI, model: str) -> None:
    started = structured(client, model, "pet", temperature=1.0, background=True, extra_body={"seed": 3})
    assert started.status == "queued"
    assert echo(started) == text_format("pet")

    def finished() -> bool:
        return client.responses.retrieve(started.id).status == "completed"

    wait_for(finished, 60, "the background response to finish", interval=0.1)
    done = client.responses.retrieve(started.id)
    jsonschema.validate(json.loads(done.output_text), SCHEMAS["pet"])
    assert echo(done) == text_format("pet")
    with client.responses.retrieve(started.id, stream=True, starting_after=0) as replay:
        events = list(replay)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == done.output_text


def _schema(**fields: Any) -> dict[str, Any]:
    """A json_schema format with `fields` changed (None: left out)."""
    fmt = {"type": "json_schema", "name": "x", "schema": {"type": "object"}, **fields}
    return {"format": {k: v for k, v in fmt.items() if v is not None}}


@pytest.mark.parametrize(
    ("text", "param"),
    [
        (_schema(schema={"type": "objec"}), "text.format.schema"),
        (_schema(schema=None), "text.format.schema"),
        (_schema(name=None), "text.format.name"),
        (_schema(name="not a name"), "text.format.name"),
        (_schema(strict="yes"), "text.format.strict"),
        (_schema(json_schema={"name": "x"}), "text.format.json_schema"),
        ({"format": {"type": "yaml"}}, "text.format.type"),
        ({"format": {"type": "json_object", "schema": {}}}, "text.format.schema"),
        ({"format": {"type": "text", "name": "x"}}, "text.format.name"),
        ({"format": "json"}, "text.format"),
    ],
)
def test_an_invalid_format_is_refused_before_queuing(stack: Stack, text: dict[str, Any], param: str) -> None:
    queued = redis.Redis.from_url(stack.redis_url).xlen(REQUESTS_STREAM)
    answer = httpx.post(f"{stack.base_url}/v1/responses", json={"input": "hi", "text": text}, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param), error
    assert "response_format" not in error["message"]
    assert redis.Redis.from_url(stack.redis_url).xlen(REQUESTS_STREAM) == queued
