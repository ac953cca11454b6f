"""What every reasoning parser shares: text is fed in pieces and held until it is decided, and a
marker's first characters at the end of the text wait for the rest."""

from __future__ import annotations

from openai_frontend.tools.parsers.deltas import ParsedDelta


def held(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that could begin one of `tags`."""
    longest = max(len(t) for t in tags) - 1
    for k in range(min(len(text), longest), 0, -1):
        if any(t.startswith(text[-k:]) for t in tags):
            return k
    return 0


class BufferedParser:
    def __init__(self) -> None:
        self._buffer = ""  # fed, not yet given out

    def feed(self, text: str) -> ParsedDelta:
        self._buffer += text
        return self._step(final=False)

    def finish(self) -> ParsedDelta:
        return self._step(final=True)

    def _step(self, final: bool) -> ParsedDelta:
        raise NotImplementedError
