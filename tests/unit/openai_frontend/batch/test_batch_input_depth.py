"""Batch input lines nested too deeply are a line error, never a RecursionError that stops the task."""

from __future__ import annotations

import json

from openai_frontend.batch.input import MAX_LINE_DEPTH, parse_input

ENDPOINT = "/v1/chat/completions"


def _line(custom_id: str, nested: str) -> str:
    return f'{{"custom_id": "{custom_id}", "method": "POST", "url": "{ENDPOINT}", "body": {{"x": {nested}}}}}'


def test_a_line_of_50k_brackets_is_a_line_error() -> None:
    ok = json.dumps({"custom_id": "ok", "method": "POST", "url": ENDPOINT, "body": {"max_tokens": 2}})
    content = "\n".join([ok, _line("deep", "[" * 50_000 + "]" * 50_000)]).encode()
    lines, errors = parse_input(content, ENDPOINT)
    assert [e["line"] for e in errors] == [2] and errors[0]["code"] == "invalid_request"
    assert f"deeper than {MAX_LINE_DEPTH} levels" in errors[0]["message"]
    assert [line.custom_id for line in lines] == ["ok"]


def test_the_bound_is_exact() -> None:
    # The line object is level 1, its body 2, "x" 3: the nested arrays take the rest.
    at_bound = _line("a", "[" * (MAX_LINE_DEPTH - 2) + "]" * (MAX_LINE_DEPTH - 2))
    over = _line("b", "[" * (MAX_LINE_DEPTH - 1) + "]" * (MAX_LINE_DEPTH - 1))
    lines, errors = parse_input(f"{at_bound}\n{over}".encode(), ENDPOINT)
    assert [line.custom_id for line in lines] == ["a"]
    assert [e["line"] for e in errors] == [2]
