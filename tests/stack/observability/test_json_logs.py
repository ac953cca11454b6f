"""LOG_FORMAT=json: every line every service writes is a JSON object; lines about a request name it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx

from common.logging_setup import JsonFormatter, RequestIdFilter, TextFormatter, request_id_var
from harness.processes.services import Stack, wait_for

SERVICES = {"gateway": "gateway", "batcher": "batcher", "worker0": "gpu_worker"}


def read_lines(stack: Stack, name: str) -> list[dict[str, Any]]:
    text = (stack.log_dir / f"{name}.log").read_text(errors="replace")
    lines = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"{name} wrote a line that is not JSON: {raw!r}") from exc
        assert isinstance(line, dict), raw
        lines.append(line)
    return lines


def test_every_service_logs_json_lines_with_the_request_id(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack()
    env = {"LOG_FORMAT": "json"}
    stack._spawn("batcher", ["batcher", "--log-level", "DEBUG"], env)  # finished requests log at DEBUG
    stack.start_worker("worker0", **env)
    stack.start_gateway(**env)
    stack.wait_ready(num_workers=1)

    body = {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    response = httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    req_id = response.json()["id"].removeprefix("cmpl-")

    def about_request(name: str) -> list[dict[str, Any]]:
        return [line for line in read_lines(stack, name) if line.get("request_id") == req_id]

    wait_for(lambda: len(about_request("gateway")) >= 2, 10, "the gateway's lines about the request")
    wait_for(lambda: len(about_request("batcher")) >= 1, 10, "the batcher's line about the request")
    stack.stop()  # shutdown lines must be JSON too

    for name, service in SERVICES.items():
        lines = read_lines(stack, name)
        assert lines, f"{name} logged nothing"
        for line in lines:
            assert {"ts", "level", "service", "logger", "msg"} <= line.keys(), line
            assert line["service"] == service, line
            if req_id in line["msg"]:
                assert line.get("request_id") == req_id, line
    gateway_msgs = [line["msg"] for line in about_request("gateway")]
    assert any("request queued" in m for m in gateway_msgs), gateway_msgs
    assert any("request finished (length)" in m for m in gateway_msgs), gateway_msgs
    # uvicorn's access line is logged inside the request's task, so it carries the id too.
    assert any("POST /v1/completions" in m for m in gateway_msgs), gateway_msgs
    assert [line["msg"] for line in about_request("batcher")] == ["request finished (length)"]


def _record(msg: str, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("cbserve.test", logging.INFO, __file__, 1, msg, (), None)
    record.__dict__.update(extra)
    RequestIdFilter().filter(record)
    return record


def test_request_id_comes_from_extra_or_the_context() -> None:
    fmt = JsonFormatter("gateway")
    assert "request_id" not in json.loads(fmt.format(_record("idle")))
    assert json.loads(fmt.format(_record("x", request_id="r1")))["request_id"] == "r1"
    token = request_id_var.set("r2")
    try:
        line = json.loads(fmt.format(_record("y")))
        assert line["request_id"] == "r2" and line["service"] == "gateway" and line["msg"] == "y"
        assert json.loads(fmt.format(_record("z", request_id="r3")))["request_id"] == "r3"  # extra wins
    finally:
        request_id_var.reset(token)


def test_text_lines_show_the_request_id_before_the_message() -> None:
    fmt = TextFormatter()
    assert fmt.format(_record("hello", request_id="r1")).endswith("INFO cbserve.test: [r1] hello")
    assert fmt.format(_record("hello")).endswith("INFO cbserve.test: hello")
