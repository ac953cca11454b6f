"""OpenAI-style error objects, and the exception handlers that turn every failure into one."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.protocol import RequestError

logger = logging.getLogger(__name__)

# RequestError codes (from the batcher / worker) that blame the request rather than the server.
_STATUS_BY_CODE = {
    "invalid_request_error": 400,
    "context_length_exceeded": 400,
    "rate_limit_exceeded": 429,
    "queue_timeout": 503,  # waited longer than GATEWAY_MAX_QUEUE_WAIT_S for a slot: overload
    "request_aborted": 410,  # its client left and nobody resumed it within the grace window
}


class OpenAIError(Exception):
    """Raised anywhere in a request; the handler answers `{"error": {...}}` with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        # A message or param may quote client input; a lone surrogate in it would fail the JSON encoding.
        self.message = _printable(message)
        self.type = type
        self.param = None if param is None else _printable(param)
        self.code = code
        self.headers = headers  # e.g. Retry-After on 429, WWW-Authenticate on 401

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """The error as an HTTP answer; every refusal (4xx) is logged with the rule that refused it."""
        if self.status < 500:
            logger.info(
                "refused: status=%d type=%s code=%s param=%s reason=%s",
                self.status,
                self.type,
                self.code,
                self.param,
                self.message[:_LOGGED_REASON_CHARS],
            )
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# Enough of the message to say which rule refused a request, without logging a whole prompt.
_LOGGED_REASON_CHARS = 160


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def from_request_error(error: RequestError) -> OpenAIError:
    status = _STATUS_BY_CODE.get(error.code, 500)
    kind = "invalid_request_error" if status < 500 else "server_error"
    return OpenAIError(status, error.message, type=kind, code=error.code)


# Seconds a client should wait while Redis is unreachable: a restart with a small AOF takes about this.
REDIS_RETRY_AFTER_S = "2"

# Pydantic names the member of a union that failed inside `loc` (e.g. ("prompt", "list[int]")): not a param.
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "function-before"}


def _param_name(loc: tuple[int | str, ...]) -> str | None:
    """("body", "messages", 0, "role") -> "messages[0].role", the form the 400 errors use."""
    parts: list[str] = []
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif part == "[key]":  # a bad dict key: name the dict, not the key the client wrote
            parts.pop()
            break
        elif part in _UNION_TAGS or "[" in part:
            break
        else:
            parts.append(f".{part}" if parts else part)
    return "".join(parts) or None


def validation_error(errors: Sequence[Any]) -> OpenAIError:
    """A body that failed its schema (pydantic's `errors()`): 400 naming the bad parameter, as OpenAI
    answers. The HTTP handler and batch lines answer with it, so a line fails exactly as the same body
    sent alone."""
    message, param = _validation_message(errors)
    return OpenAIError(400, message, param=param)


def _most_telling(errors: Sequence[Any]) -> Any:
    # A value that fails every member of a union is reported once per member; a failed check of our
    # own (e.g. invalid Unicode) says more than "Input should be a valid list".
    return next((e for e in errors if e.get("type") == "value_error"), errors[0])


def _validation_message(errors: Sequence[Any]) -> tuple[str, str | None]:
    if not errors:
        return "invalid request body", None
    first = _most_telling(errors)
    param = _param_name(first.get("loc", ()))
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "json_invalid":
        return f"request body is not valid JSON: {first.get('ctx', {}).get('error', message)}", None
    if first.get("type") == "string_unicode":  # pydantic's own check, on a field name
        message = "a field name is not valid Unicode (a lone surrogate)"
    if first.get("type") == "extra_forbidden":
        message = "unknown parameter (not part of the OpenAI API this server implements)"
    return (f"{param}: {message}" if param else message), param


async def _openai_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return exc.response()


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_error(exc.errors()).response()


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    headers = dict(exc.headers) if exc.headers else None
    return OpenAIError(exc.status_code, str(exc.detail), type=kind, headers=headers).response()


async def _redis_error(_: Request, exc: Exception) -> JSONResponse:
    logger.warning("redis unavailable: %s", exc)
    error = OpenAIError(
        503,
        "the request queue is unavailable (redis unreachable), retry later",
        type="server_error",
        code="redis_unavailable",
        headers={"Retry-After": REDIS_RETRY_AFTER_S},
    )
    return error.response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(redis.exceptions.RedisError, _redis_error)
