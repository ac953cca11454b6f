"""A batch input file (JSONL) into its requests, or the errors that fail the whole batch. No I/O.

Each non-blank line is `{"custom_id": str, "method": "POST", "url": <the batch's endpoint>, "body":
{...}}`. A line that breaks this shape (not JSON, a missing, repeated or too long custom_id, another
method or url) fails the batch while it is `validating`, with the line numbers in `errors`, as OpenAI
does. A body that the endpoint would refuse is only found when its line runs: that line goes to the
error file with the endpoint's own answer, and the other lines run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from openai_frontend.protocol.strings import MAX_ID_CHARS

# A file with more faults than this reports only the first ones.
MAX_REPORTED_ERRORS = 100
# Arrays and objects nested deeper than this fail the line (and so the batch, while validating): the
# endpoints' own checks recurse, and a line of 50,000 `[` stopped the task in RecursionError.
MAX_LINE_DEPTH = 128


@dataclass(slots=True, frozen=True)
class InputLine:
    index: int  # position among the file's requests, from 0: names the line's request ids
    line: int  # line number in the file, from 1
    custom_id: str
    body: dict[str, Any]


def _error(code: str, message: str, line: int, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest deeper than `limit` in `value` (no recursion of our own)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


def _check(raw: str, line: int, endpoint: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the request object, None) for a well-formed line, else (None, its error)."""
    too_deep = f"line {line} nests arrays and objects deeper than {MAX_LINE_DEPTH} levels"
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, _error("invalid_json_line", f"line {line} is not valid JSON: {exc.msg}", line)
    except RecursionError:
        return None, _error("invalid_request", too_deep, line)
    if _deeper_than(obj, MAX_LINE_DEPTH):
        return None, _error("invalid_request", too_deep, line)
    if not isinstance(obj, dict):
        return None, _error("invalid_request", f"line {line} must be a JSON object", line)
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        message = f"line {line} needs a custom_id: a non-empty string"
        return None, _error("missing_required_parameter", message, line, "custom_id")
    if len(custom_id) > MAX_ID_CHARS:  # it is stored, and quoted back in the output and error files
        message = f"line {line}: custom_id has {len(custom_id)} characters, more than {MAX_ID_CHARS}"
        return None, _error("string_above_max_length", message, line, "custom_id")
    if obj.get("method") != "POST":
        message = f"line {line}: method must be POST, got {obj.get('method')!r}"
        return None, _error("invalid_request", message, line, "method")
    if obj.get("url") != endpoint:
        message = f"line {line}: url must be the batch's endpoint {endpoint}, got {obj.get('url')!r}"
        return None, _error("mismatched_url", message, line, "url")
    if not isinstance(obj.get("body"), dict):
        message = f"line {line} needs a body: the JSON object to send to {endpoint}"
        return None, _error("missing_required_parameter", message, line, "body")
    return obj, None


def parse_input(content: bytes, endpoint: str) -> tuple[list[InputLine], list[dict[str, Any]]]:
    """The file's requests in order, and the errors that fail the batch (empty when it is well formed)."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return [], [_error("invalid_file_format", "the input file is not UTF-8 encoded", 1)]
    lines: list[InputLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        obj, error = _check(raw, number, endpoint)
        if obj is not None and obj["custom_id"] in seen:
            message = f"line {number}: custom_id {obj['custom_id']!r} is used by an earlier line"
            obj, error = None, _error("duplicate_custom_id", message, number, "custom_id")
        if obj is None:
            assert error is not None
            errors.append(error)
            continue
        seen.add(obj["custom_id"])
        lines.append(InputLine(len(lines), number, obj["custom_id"], obj["body"]))
    if not lines and not errors:
        errors.append(_error("empty_file", "the input file holds no requests", 1))
    return lines, errors[:MAX_REPORTED_ERRORS]
