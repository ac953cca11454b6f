"""One logging setup for every service: text lines for people, or JSON lines for log pipelines.

`LOG_FORMAT=json` makes each record one JSON object with `ts`, `level`, `service`, `logger`, `msg`
and, on lines about a request, `request_id`. The id comes from `extra={"request_id": ...}` or, in
the gateway, from the `request_id` context variable that a request's task sets once (`bind_request_id`),
so every line logged while serving it carries the id without threading it through every call.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]

# The request the current task (or thread) is serving; None outside any request.
request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def bind_request_id(request_id: str) -> None:
    """Mark every later log line of the current task (and tasks it starts) as about `request_id`."""
    request_id_var.set(request_id)


class RequestIdFilter(logging.Filter):
    """Gives every record a `request_id` attribute: its own `extra`, else the context's, else None."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            line["request_id"] = request_id
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        # default=str: a stray non-JSON value in a message must never cost the log line.
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The classic line, with `[request_id]` before the message when the line is about a request."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        request_id = getattr(record, "request_id", None)
        if request_id is None:
            return text
        head, sep, tail = text.partition(": ")
        return f"{head}: [{request_id}] {tail}" if sep else text


def configure_logging(service: str, log_format: LogFormat = "text", level: str | int = "INFO") -> None:
    """Replace the root logger's handlers with one stderr handler in `log_format`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter(service) if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)  # `warnings.warn` output becomes records too, not bare stderr text
