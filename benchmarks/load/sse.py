"""Server-sent events parsing: bytes in, the `data:` payload of each complete event out."""

from __future__ import annotations

import codecs


class SSEParser:
    """Accumulates a byte stream and yields the data of every event it completes.

    Events end with a blank line (`\\n\\n`, or `\\r\\n\\r\\n`); a multi-line event's `data:` lines are
    joined with newlines; comment lines (`: ping`) and `id:` / `event:` fields are dropped.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._buffer = ""

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += self._decoder.decode(chunk).replace("\r\n", "\n")
        payloads: list[str] = []
        while "\n\n" in self._buffer:
            event, self._buffer = self._buffer.split("\n\n", 1)
            data = [line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:")]
            if data:
                payloads.append("\n".join(data))
        return payloads
