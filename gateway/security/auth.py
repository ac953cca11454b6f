"""Bearer API keys on every path but /health and the dashboard's static files, as a pure ASGI
middleware (it never buffers a stream). Anthropic's clients send the key as `x-api-key`: it counts as
the Bearer token does.

The owner (the key's name) is put in the ASGI scope; routes read it with `request_owner`, so a request
carries who made it into Redis without the key itself ever leaving this module.
"""

from __future__ import annotations

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.dashboard_assets import OPEN_PATHS as DASHBOARD_FILES
from gateway.errors import error_response
from gateway.security.api_keys import ApiKeys
from openai_frontend.protocol.errors import OpenAIError

# Probes (load balancers, compose healthchecks) carry no key; the dashboard's page asks for one itself.
OPEN_PATHS = frozenset({"/health"}) | DASHBOARD_FILES
_OWNER_KEY = "cbserve.owner"


def _unauthorized(message: str) -> OpenAIError:
    return OpenAIError(
        401,
        message,
        type="invalid_request_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


class AuthMiddleware:
    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys.enabled or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = HTTPConnection(scope).headers
        scheme, _, key = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            key = headers.get("x-api-key", "")  # Anthropic's header
        path = scope["path"]
        if not key.strip():
            error = _unauthorized(
                "You didn't provide an API key. Send it in the Authorization header as `Bearer <key>` "
                "(or as x-api-key)."
            )
            await error_response(error, path)(scope, receive, send)
            return
        owner = self.keys.owner_of(key.strip())
        if owner is None:
            await error_response(_unauthorized("Incorrect API key provided."), path)(scope, receive, send)
            return
        scope[_OWNER_KEY] = owner
        await self.app(scope, receive, send)


def request_owner(connection: HTTPConnection) -> str:
    """Name of the key that authenticated this request; "" when the API is open."""
    return str(connection.scope.get(_OWNER_KEY, ""))
