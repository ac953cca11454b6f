"""The exception handlers that turn every failure of an HTTP request into an OpenAI error answer."""

from __future__ import annotations

import logging

import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.redis_io.redis_refusal import refuses_writes
from gateway.errors import error_response
from openai_frontend.anthropic.errors import speaks_anthropic
from openai_frontend.protocol.errors import OpenAIError, validation_error

logger = logging.getLogger(__name__)

# Seconds a client should wait while Redis is unreachable: a restart with a small AOF takes about this.
REDIS_RETRY_AFTER_S = "2"


async def _openai_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return error_response(exc, request.url.path)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    api = "Anthropic Messages API" if speaks_anthropic(request.url.path) else "OpenAI API"
    return error_response(validation_error(exc.errors(), api), request.url.path)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    headers = dict(exc.headers) if exc.headers else None
    message, code = str(exc.detail), None
    # The router's own refusals name the path: an SDK reading a bare "Not Found" blames the model.
    path = request.url.path
    if exc.status_code == 404:
        message = f"Unrecognized request URL ({request.method} {path}); this server does not serve it"
        code = "not_found"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {path}"
        code = "method_not_allowed"
    error = OpenAIError(exc.status_code, message, type=kind, code=code, headers=headers)
    return error_response(error, path)


async def _redis_error(request: Request, exc: Exception) -> JSONResponse:
    if refuses_writes(exc):  # up, but full (maxmemory) or read-only: say so, not "unreachable"
        logger.warning("redis refuses writes: %s", exc)
        message = "the request queue is full (redis refuses writes), retry later"
        code = "redis_full"
        return error_response(
            OpenAIError(
                503, message, type="server_error", code=code, headers={"Retry-After": REDIS_RETRY_AFTER_S}
            ),
            request.url.path,
        )
    logger.warning("redis unavailable: %s", exc)
    error = OpenAIError(
        503,
        "the request queue is unavailable (redis unreachable), retry later",
        type="server_error",
        code="redis_unavailable",
        headers={"Retry-After": REDIS_RETRY_AFTER_S},
    )
    return error_response(error, request.url.path)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(redis.exceptions.RedisError, _redis_error)
