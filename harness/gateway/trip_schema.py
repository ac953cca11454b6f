"""The trip the structured-output stack tests ask for, and Responses API answers that follow it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import jsonschema
import openai
from openai.types.responses import Response

# A city and a number of days: every answer that follows it terminates.
TRIP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
}


def schema_responses(
    client: openai.OpenAI, model: str, bias: dict[str, float], seeds: Iterable[int], schema: dict[str, Any]
) -> Iterator[tuple[int, Response, dict[str, Any]]]:
    """For each seed: the seed, the Responses API's answer to "Where to?" with `text.format` the json_schema
    `schema` (sampled at temperature 1 under `bias`), its text checked against `schema`, and the
    arguments that made it (to ask again, streamed)."""
    for seed in seeds:
        params: dict[str, Any] = {
            "model": model,
            "input": "Where to?",
            "max_output_tokens": 200,
            "temperature": 1.0,
            "text": {"format": {"type": "json_schema", "name": "trip", "schema": schema}},
            "extra_body": {"logit_bias": bias, "seed": seed},
        }
        response = client.responses.create(**params)
        jsonschema.validate(json.loads(response.output_text), schema)
        yield seed, response, params
