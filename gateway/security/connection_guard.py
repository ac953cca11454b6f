"""Bounds on what one HTTP connection may hold: time to send its headers and its body, and a cap
on connections open at once. uvicorn bounds only the idle time between requests
(`timeout_keep_alive`); a client that trickles its headers or its body a byte at a time would
otherwise keep its socket (and, for a body, a running request task) forever.

`guarded_protocol(limits)` is uvicorn's h11 protocol with those bounds added: a connection whose
headers are not complete `header_timeout_s` after it opened (or after its previous response) is
answered 408 and closed, so is one whose body is not complete `body_timeout_s` after its headers,
and a connection past `max_connections` is closed as soon as it is accepted.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

_BODY_408 = json.dumps(
    {
        "error": {
            "message": "the request was not received in time",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_timeout",
        }
    }
).encode()
RESPONSE_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: " + str(len(_BODY_408)).encode() + b"\r\n\r\n" + _BODY_408
)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float  # from connecting (or the previous response) to the headers' end
    body_timeout_s: float  # from the headers' end to the body's end
    max_connections: int  # open at once in this process; more are closed at accept


def uvicorn_options(settings: GatewaySettings) -> dict[str, Any]:
    """uvicorn.run / uvicorn.Config keyword arguments for the settings' connection bounds."""
    limits = ConnectionLimits(settings.header_timeout_s, settings.body_timeout_s, settings.max_connections)
    return {"timeout_keep_alive": settings.keep_alive_s, "http": guarded_protocol(limits)}


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    class GuardedH11Protocol(_GuardedH11Protocol):
        pass

    GuardedH11Protocol.limits = limits
    return GuardedH11Protocol


class _GuardedH11Protocol(H11Protocol):
    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str = ""  # "headers" or "body" while a deadline runs

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        if len(self.connections) > self.limits.max_connections:
            logger.warning(
                "refused a connection: %d open (GATEWAY_MAX_CONNECTIONS)", len(self.connections) - 1
            )
            self.transport.close()
            return
        self._arm("headers", self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and not self._waiting_for:
            # The first bytes of a next request on a kept-alive connection: its headers' clock starts.
            self._arm("headers", self.limits.header_timeout_s)
        super().data_received(data)
        self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_state()

    def _follow_state(self) -> None:
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._waiting_for != "body":
                self._arm("body", self.limits.body_timeout_s)
        elif state is not h11.IDLE or self._waiting_for == "body":
            # Headers and body in (or the connection is over); a kept-alive connection is idle now,
            # which uvicorn's timeout_keep_alive bounds until its next request's first byte.
            self._disarm()

    def _arm(self, what: str, timeout_s: float) -> None:
        self._disarm()
        self._waiting_for = what
        self._deadline = self.loop.call_later(timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._waiting_for = ""

    def _expired(self) -> None:
        what = self._waiting_for
        self._deadline = None
        self._waiting_for = ""
        if self.transport.is_closing():
            return
        logger.info("closed a connection: its %s did not arrive in time (408)", what)
        # Waiting for headers, any previous response is complete; waiting for a body, the app may
        # have answered already (then the socket is just closed).
        if what == "headers" or self.cycle is None or not self.cycle.response_started:
            self.transport.write(RESPONSE_408)
        if what == "body" and self.cycle is not None:
            self.cycle.keep_alive = False
        self.transport.close()
