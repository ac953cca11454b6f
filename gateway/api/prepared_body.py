"""FastAPI's reading of a JSON body, with the parsing and the validation done by the prepare pool.

FastAPI parses a body (`json.loads`) and validates it against the route's schema on the event loop:
for a 4.4 MB body of 130,000 short chat messages that took 0.74 s, in which the loop served nobody.
Routes of this class hand both to the prepare pool (gateway/prepare_pool.py), which runs them on a
thread when the body is large; FastAPI then gets the validated object, which it passes on as it is.
FastAPI still decides whether the body is JSON (its content type), and its errors are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.app_state import get_state

_UNREAD = object()


class _InvalidBody(HTTPException):
    # FastAPI lets an HTTPException raised while it reads the body through untouched (any other
    # exception would become a bare 400); the route turns it back into FastAPI's validation error.
    def __init__(self, errors: list[dict[str, Any]], body: Any) -> None:
        super().__init__(400)
        self.errors, self.body = errors, body


def _parsed(body: bytes, field: Any) -> Any:
    """The body as FastAPI would hand it to the route: parsed, then validated as the route's one
    body parameter; a JSONDecodeError goes to FastAPI, which words it."""
    value = json.loads(body)
    if field is None:
        return value
    validated, errors = field.validate(value, {}, loc=("body",))
    if errors:
        raise _InvalidBody(errors, value)
    return validated


class _PreparedRequest(Request):
    def __init__(self, request: Request, field: Any) -> None:
        super().__init__(request.scope, request.receive)
        self._field = field
        self._parsed: Any = _UNREAD

    async def json(self) -> Any:
        if self._parsed is _UNREAD:
            body = await self.body()
            self._parsed = await get_state(self).prepare.run(len(body), _parsed, body, self._field)
        return self._parsed


class PreparedBodyRoute(APIRoute):
    """An APIRoute whose JSON body is parsed and validated off the event loop when it is large."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        # One body parameter is the whole body, validated here as FastAPI would; with several, each
        # is a key of it, and only the parsing moves.
        field = None if self._embed_body_fields else self.body_field

        async def handler(request: Request) -> Response:
            try:
                return await handle(_PreparedRequest(request, field))
            except _InvalidBody as exc:
                raise RequestValidationError(exc.errors, body=exc.body) from None

        return handler
