"""A batch's params as Redis keeps them (JSON): the served models' rules whole, so that its Celery task
reads the lines by exactly the gateway's rules; params stored before (one model's rules, or four of
them at the top level) still read, with the rules they held and the others at their defaults."""

from __future__ import annotations

import json

import msgspec

from openai_frontend.batch.objects import BatchParams, decode_params
from openai_frontend.model.served_model import ModelRules

FIXED = {
    "id": "batch_1",
    "endpoint": "/v1/chat/completions",
    "input_file_id": "file-1",
    "completion_window": "24h",
    "created_at": 100,
    "expires_at": 200,
    "retain_until": 300,
    "owner": "alice",
}


def test_the_rules_come_back_whole() -> None:
    rules = ModelRules(
        name="m",
        max_model_len=64,
        max_prompt_tokens=32,
        max_tokens=8,
        special_tokens_in_content=True,
        tool_parser="hermes",
        reasoning_parser="think",
        path_names=frozenset({"models/m", "/srv/models/m"}),
        cells=("m0", "m1"),
    )
    params = BatchParams(**FIXED, models=[rules, ModelRules(name="n", max_model_len=32)])
    assert decode_params(msgspec.json.encode(params)) == params


def test_params_stored_with_one_models_rules_still_read() -> None:
    rules = ModelRules(name="m", max_model_len=64, tool_parser="hermes")
    stored = {
        **msgspec.to_builtins(BatchParams(**FIXED, models=[rules])),
        "rules": msgspec.to_builtins(rules),
    }
    del stored["models"]
    assert decode_params(json.dumps(stored).encode()) == BatchParams(**FIXED, models=[rules])


def test_params_stored_with_four_rules_still_read() -> None:
    stored = {**FIXED, "metadata": None, "model": "m", "max_model_len": 64, "max_tokens": 8}
    params = decode_params(json.dumps(stored).encode())
    assert params == BatchParams(**FIXED, models=[ModelRules(name="m", max_model_len=64, max_tokens=8)])
