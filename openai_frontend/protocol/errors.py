"""OpenAI-style error objects: every refusal or failure of a request, HTTP or batch line, is one."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from common.protocol import RequestError

# RequestError codes (from the batcher / worker) that blame the request rather than the server.
_STATUS_BY_CODE = {
    "invalid_request_error": 400,
    "context_length_exceeded": 400,
    "rate_limit_exceeded": 429,
    "queue_timeout": 503,  # waited longer than GATEWAY_MAX_QUEUE_WAIT_S for a slot: overload
    "request_aborted": 410,  # its client left and nobody resumed it within the grace window
    "request_lost": 503,  # Redis lost it (restarted without persistence): send it again
    "no_batcher": 503,  # its cell had no batcher for a while (openai_frontend/follow/stream_watch.py)
}
# Every 503 says when to try again (RFC 9110 Retry-After): each is a passing state (no batcher yet, Redis
# away or full, a request Redis lost), and client libraries back off by the header when it is there.
RETRY_AFTER_S = 2


class OpenAIError(Exception):
    """Raised anywhere in a request; the gateway answers `{"error": {...}}` with `status`."""

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
        self.headers = _with_retry_after(headers) if status == 503 else headers  # WWW-Authenticate on 401

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _with_retry_after(headers: dict[str, str] | None) -> dict[str, str]:
    if any(name.lower() == "retry-after" for name in headers or {}):
        return dict(headers or {})
    return {**(headers or {}), "Retry-After": str(RETRY_AFTER_S)}


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def too_long(param: str, limit: int, length: int, key: bool = False) -> OpenAIError:
    """A string past its field's cap (openai_frontend/protocol/strings.py), in OpenAI's words."""
    what = f"a key of '{param}'" if key else f"'{param}'"
    return invalid_request(
        f"Invalid {what}: string too long. Expected a string with maximum length {limit}, but got a "
        f"string with length {length} instead.",
        param,
        "string_above_max_length",
    )


def timed_out_error() -> OpenAIError:
    """The request did not end within its time (GATEWAY_REQUEST_TIMEOUT_S, or its follower's wait)."""
    return OpenAIError(504, "the request did not finish in time", type="server_error", code="timeout")


def queue_unavailable() -> OpenAIError:
    """Redis went away while a request was followed."""
    return OpenAIError(503, "the request queue became unavailable", type="server_error")


def from_request_error(error: RequestError) -> OpenAIError:
    status = _STATUS_BY_CODE.get(error.code, 500)
    kind = "invalid_request_error" if status < 500 else "server_error"
    return OpenAIError(status, error.message, type=kind, code=error.code)


# Pydantic names the member of a union that failed inside `loc` (e.g. ("prompt", "list[int]")): not a param.
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "function-before"}
_UNION_MEMBER = re.compile(r"[\w-]+\[.*\]", re.DOTALL)  # e.g. "list[ContentBlock]"; not "[key]"


def _is_union_tag(part: int | str) -> bool:
    return isinstance(part, str) and (part in _UNION_TAGS or _UNION_MEMBER.fullmatch(part) is not None)


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


def validation_error(errors: Sequence[Any], api: str = "OpenAI API") -> OpenAIError:
    """A body that failed its schema (pydantic's `errors()`): 400 naming the bad parameter, as OpenAI
    answers. The HTTP handler and batch lines answer with it, so a line fails exactly as the same body
    sent alone. `api` names the API whose fields an unknown parameter is not among."""
    if errors and _most_telling(errors).get("type") == "string_too_long":
        return _too_long_error(_most_telling(errors))
    message, param = _validation_message(errors, api)
    return OpenAIError(400, message, param=param)


def _too_long_error(error: Any) -> OpenAIError:
    loc = tuple(error.get("loc", ()))
    key = "[key]" in loc
    if not key:  # named through the union member it is in (a content block, an input item)
        loc = tuple(part for part in loc if not _is_union_tag(part))
    length = len(error["input"]) if isinstance(error.get("input"), str) else 0
    limit = int(error.get("ctx", {}).get("max_length", 0))
    return too_long(_param_name(loc) or "body", limit, length, key=key)


def _most_telling(errors: Sequence[Any]) -> Any:
    # A value that fails every member of a union is reported once per member; a failed check of our
    # own (e.g. invalid Unicode), or a string past its cap, says more than "Input should be a valid list".
    return next(
        (e for kind in ("value_error", "string_too_long") for e in errors if e.get("type") == kind), errors[0]
    )


def _validation_message(errors: Sequence[Any], api: str) -> tuple[str, str | None]:
    if not errors:
        return "invalid request body", None
    first = _most_telling(errors)
    param = _param_name(first.get("loc", ()))
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "json_invalid":
        return f"request body is not valid JSON: {first.get('ctx', {}).get('error', message)}", None
    if first.get("type") == "string_unicode":  # pydantic's own check: of a field name, or of a capped value
        message = "not valid Unicode (a lone surrogate)"
        if param is None:
            message = f"a field name is {message}"
    if first.get("type") == "extra_forbidden":
        message = f"unknown parameter (not part of the {api} this server implements)"
    return (f"{param}: {message}" if param else message), param
