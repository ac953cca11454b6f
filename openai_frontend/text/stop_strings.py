"""Stop-string matching on the detokenized output, with the hold-back streaming needs."""

from __future__ import annotations


class StopStringMatcher:
    """Accumulates output text, cuts it before the first stop string, and tells what is safe to emit.

    While streaming, the last `max(len(stop)) - 1` characters are held back: they might be the start of
    a stop string that the next token completes, and a client must never see part of a stop string.
    """

    def __init__(self, stop: list[str], include_stop: bool = False) -> None:
        self.stop = [s for s in stop if s]
        self._include_stop = include_stop  # cut after the stop string instead (include_stop_str_in_output)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""
        self.stopped = False
        self._num_emitted = 0

    def append(self, delta: str) -> bool:
        """Add new output text; True when a stop string now matches (the text is cut before it)."""
        if self.stopped or not delta:
            return self.stopped
        # Only a match overlapping the new text is new; earlier text was already searched.
        search_from = max(len(self.text) - self._hold, 0)
        self.text += delta
        hits = [(pos, s) for s in self.stop if (pos := self.text.find(s, search_from)) != -1]
        if hits:
            pos, s = min(hits)
            self.text = self.text[: pos + len(s)] if self._include_stop else self.text[:pos]
            self.stopped = True
        return self.stopped

    def take(self, *, final: bool) -> str:
        """Text not emitted yet that can be emitted now; `final` releases the held-back tail."""
        end = len(self.text) if final or self.stopped else max(len(self.text) - self._hold, 0)
        if end <= self._num_emitted:
            return ""
        out = self.text[self._num_emitted : end]
        self._num_emitted = end
        return out
