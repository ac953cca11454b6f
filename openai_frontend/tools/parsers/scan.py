"""Where a bracketed value a model writes ends, read as it streams in (strings skipped whole)."""

from __future__ import annotations

_OPENING = "([{"
_CLOSING = ")]}"


def balanced_end(text: str, at: int, quotes: str = '"') -> int | None:
    """Just after the bracket that closes the one at `at` (`(`, `[` or `{`); None when the text ends
    first. Brackets inside strings (delimited by any of `quotes`, backslash escapes) do not count."""
    depth, quote, escaped = 0, "", False
    for i in range(at, len(text)):
        char = text[i]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in quotes:
            quote = char
        elif char in _OPENING:
            depth += 1
        elif char in _CLOSING:
            depth -= 1
            if depth == 0:
                return i + 1
    return None
