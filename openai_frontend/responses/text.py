"""The Responses API's `text.format` as chat's `response_format`, and as the Response echoes it.

`{"type": "json_schema", "name", "schema", "description", "strict"}` is chat's
`{"type": "json_schema", "json_schema": {...}}` flattened; `json_object` and `text` are the same on
both. The chat request checks and enforces it (structured/constraint.py: one grammar, a 400 before
anything is queued); `input.responses_names` renames chat's parameters in its errors.
"""

from __future__ import annotations

import re
from typing import Any

from openai_frontend.protocol.errors import OpenAIError, invalid_request
from openai_frontend.protocol.openai_schemas import JSONSchemaFormat, ResponseFormat
from openai_frontend.responses.schemas import TextConfig, TextFormat

TEXT: dict[str, Any] = {"type": "text"}  # the default format
_TYPES = ("text", "json_object", "json_schema")
_SCHEMA_FIELDS = ("name", "description", "schema_", "strict")
# Chat's names for the format's parts, as they appear in a chat request's errors (longest first).
_CHAT_NAMES = re.compile(r"response_format(\.json_schema)?")


def check_text(text: TextConfig | None) -> None:
    """Refuses what `text` asks that is not implemented, by name."""
    if text is not None and text.verbosity not in (None, "medium"):
        raise invalid_request(
            "text.verbosity is not supported by this server", "text.verbosity", "unsupported_parameter"
        )


def response_format(text: TextConfig | None) -> ResponseFormat | None:
    """The chat `response_format` that asks for `text.format`; None for plain text."""
    fmt = None if text is None else text.format
    if fmt is None:
        return None
    if fmt.type not in _TYPES:
        raise invalid_request(
            f"text.format.type must be text, json_object or json_schema, got {fmt.type!r}", "text.format.type"
        )
    if fmt.type != "json_schema":
        for name in _SCHEMA_FIELDS:
            if getattr(fmt, name) is not None:
                param = f"text.format.{name.rstrip('_')}"
                raise invalid_request(f"{param} needs text.format.type json_schema", param)
        return ResponseFormat(type=fmt.type)
    for name in ("name", "schema_"):
        if getattr(fmt, name) is None:
            param = f"text.format.{name.rstrip('_')}"
            raise invalid_request(f"{param} is required", param)
    schema = JSONSchemaFormat.model_validate(
        {"name": fmt.name, "description": fmt.description, "schema": fmt.schema_, "strict": fmt.strict}
    )
    return ResponseFormat(type="json_schema", json_schema=schema)


def format_echo(fmt: TextFormat | None) -> dict[str, Any]:
    """`text.format` as the Response object echoes it: as asked, with only the fields given."""
    if fmt is None:
        return TEXT
    echo = fmt.model_dump(by_alias=True, include={"type", *_SCHEMA_FIELDS})
    return {key: value for key, value in echo.items() if value is not None}


def in_responses_terms(error: OpenAIError) -> None:
    """Names `text.format` where a chat request's error names `response_format`."""
    if error.param is not None:
        error.param = _CHAT_NAMES.sub("text.format", error.param)
    error.message = _CHAT_NAMES.sub("text.format", error.message)
