"""An OpenAIError as an HTTP answer, for the exception handlers (gateway/api/error_handlers.py) and the
middlewares that refuse a request before any route runs (gateway/security/): in OpenAI's shape, or in
Anthropic's on the Messages API's paths."""

from __future__ import annotations

import logging

from fastapi.responses import JSONResponse

from openai_frontend.anthropic.errors import error_body, speaks_anthropic
from openai_frontend.protocol.errors import OpenAIError

logger = logging.getLogger(__name__)

# Enough of the message to say which rule refused a request, without logging a whole prompt.
_LOGGED_REASON_CHARS = 160


def error_response(error: OpenAIError, path: str = "") -> JSONResponse:
    """The error as an HTTP answer to a request for `path`; every refusal (4xx) is logged with the
    rule that refused it."""
    if error.status < 500:
        logger.info(
            "refused: status=%d type=%s code=%s param=%s reason=%s",
            error.status,
            error.type,
            error.code,
            error.param,
            error.message[:_LOGGED_REASON_CHARS],
        )
    body = error_body(error) if speaks_anthropic(path) else error.body()
    return JSONResponse(body, status_code=error.status, headers=error.headers)
