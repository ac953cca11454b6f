"""Errors in the Messages API's shape: `{"type": "error", "error": {"type": ..., "message": ...}}`.

Every refusal is raised as an OpenAIError, as on the other endpoints; the gateway writes it in this
shape for the Messages API's paths (gateway/errors.py), with Anthropic's error type for its status.
"""

from __future__ import annotations

from typing import Any

from openai_frontend.protocol.errors import OpenAIError

PATH_PREFIX = "/v1/messages"  # POST /v1/messages and /v1/messages/count_tokens
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",  # the queue is full or unreachable: retry later
    504: "timeout_error",
    529: "overloaded_error",
}


def speaks_anthropic(path: str) -> bool:
    return path == PATH_PREFIX or path.startswith(PATH_PREFIX + "/")


def error_type(status: int) -> str:
    return _TYPE_BY_STATUS.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(error: OpenAIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(error.status), "message": error.message}}
