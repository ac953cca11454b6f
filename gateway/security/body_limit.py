"""Refuse request bodies over GATEWAY_MAX_BODY_BYTES with 413, before any JSON is parsed.

A declared Content-Length over the limit is refused without reading a byte; a chunked body is read
up to the limit and then refused. Bodies under the limit are buffered here (FastAPI reads the whole
JSON body anyway) and replayed to the app, after which `receive` is the server's again, so
disconnects are still seen.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import error_response
from openai_frontend.protocol.errors import OpenAIError


def _too_large(limit: int) -> OpenAIError:
    return OpenAIError(
        413, f"request body is larger than {limit} bytes", type="invalid_request_error", code="body_too_large"
    )


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, path_limits: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.path_limits = path_limits or {}  # paths with a limit of their own (file uploads)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope["path"], self.max_body_bytes)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await error_response(_too_large(limit), scope["path"])(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client left while sending; let the app see it as it would have.
                first: list[Message] = [message]
                break
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await error_response(_too_large(limit), scope["path"])(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                first = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
                break

        async def replay() -> Message:
            return first.pop() if first else await receive()

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
