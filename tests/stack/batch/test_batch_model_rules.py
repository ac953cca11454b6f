"""A Batch API line is read by the served model's own rules, as the same body over HTTP is.

The model's chat template names neither a tool-call format nor a reasoning format, so only the
operator's GATEWAY_TOOL_PARSER (hermes) and GATEWAY_REASONING_PARSER (think) make its calls and thoughts
readable. A chat line's thoughts must come back as `reasoning_content` and its call as `tool_calls`,
exactly as the interactive endpoint answers the same body. The weights are random: a logit bias opens
the thoughts at once and closes them a few tokens later (as in test_e2e_reasoning.py), and
tool_choice required forces a call after them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from harness.gateway.trip_schema import TRIP_SCHEMA
from harness.load.batch_runs import request_line
from harness.models.tiny_model import build_tiny_model
from harness.processes.services import Stack, running_stack
from tests.stack.batch.test_batch_api import file_lines, run_batch, same_body

# ChatML that lists the tools as plain JSON: no `<tool_call>` and no `<think>` for `auto` to read.
TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\nFunctions: ' + (tools | tojson) + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "book", "parameters": TRIP_SCHEMA}}]
SEEDS = range(6)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules-models") / "plain-tools"
    return build_tiny_model(path, max_len=1024, chat_template=TEMPLATE, added_tokens=["<think>", "</think>"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("batch-model-rules"),
        model_dir,
        celery_env={},
        GATEWAY_TOOL_PARSER="hermes",
        GATEWAY_REASONING_PARSER="think",
    ) as stack:
        yield stack


@pytest.fixture(scope="module")
def bias(model_dir: Path) -> dict[str, float]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>")}
    return {str(ids["<think>"]): 30.0, str(ids["</think>"]): 4.0}


def _body(seed: int, bias: dict[str, float]) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Where to?"}],
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "logit_bias": bias,
        "temperature": 1.0,
        "seed": seed,
        "max_tokens": 200,
    }


def _without_call_ids(body: dict[str, Any]) -> dict[str, Any]:
    """A call's id derives from its request's id, which a batch line has its own of."""
    for choice in body["choices"]:
        for call in choice["message"].get("tool_calls") or []:
            call.pop("id")
    return body


def test_a_batch_line_reads_thoughts_and_calls_as_http_does(stack: Stack, bias: dict[str, float]) -> None:
    bodies = {f"seed-{seed}": _body(seed, bias) for seed in SEEDS}
    with stack.sdk(timeout=60) as client:
        batch = run_batch(client, [request_line(custom_id, body) for custom_id, body in bodies.items()])
        assert batch.status == "completed" and batch.error_file_id is None, batch
        results = file_lines(client, batch.output_file_id)
    read_both = 0
    for custom_id, body in bodies.items():
        response = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        got = _without_call_ids(results[custom_id]["response"]["body"])
        same_body(got, _without_call_ids(response.json()))
        message = got["choices"][0]["message"]
        read_both += bool(message.get("reasoning_content") and message.get("tool_calls"))
    assert read_both, "no seed thought, then called"
