"""gpt-oss's harmony tool calls: a message to a function, its recipient in the header either after the
channel (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`) or
before it (`<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}`).

The harmony reasoning parser (reasoning/harmony.py) hands such messages over whole and the rest as
plain text; without it the other messages' markers stay in the content. Arguments stream as written;
a call cut off by max_tokens keeps what was written (`<|call|>` is gpt-oss's stop token, never shown).
"""

from __future__ import annotations

import regex

from openai_frontend.tools.parsers.scan import balanced_end
from openai_frontend.tools.parsers.snapshot import Call, Reading, blanks_held

_NAME = r"to=functions\.(?P<name>[A-Za-z0-9_.-]+)\s*"
# Any message's header; `name` is set only for a message to a function.
_HEADER = regex.compile(
    r"(?:<\|start\|>\s*assistant\s*(?:" + _NAME + r")?)?<\|channel\|>\s*\w+\s*(?:" + _NAME + r")?"
    r"(?:json\s*)?(?:<\|constrain\|>\s*\w*\s*)?<\|message\|>"
)
_CALL_END = regex.compile(r"\s*(?:<\|call\|>)?")
_MESSAGE = "<|message|>"


def read_harmony(text: str, final: bool) -> Reading:
    reading = Reading()
    pos = 0
    while (head := _HEADER.search(text, pos)) is not None:
        name = head.group("name")
        if name is None:  # a message not to a function: content, markers and all
            reading.content += text[pos : head.end()]
            pos = head.end()
            continue
        reading.content += text[pos : head.start()]
        start = head.end()
        brace = start + len(text[start:]) - len(text[start:].lstrip())
        end = balanced_end(text, brace) if text[brace : brace + 1] == "{" else None
        if end is None:
            reading.calls.append(Call(name, text[brace:]))  # still being written, or cut off
            return _settled(reading, final)
        reading.calls.append(Call(name, text[brace:end]))
        tail = _CALL_END.match(text, end)
        pos = tail.end() if tail is not None else end
    rest = text[pos:]
    if not final:  # a header may be opening: hold from its first marker
        after = rest.rfind(_MESSAGE)
        cut = rest.find("<|", after + len(_MESSAGE) if after >= 0 else 0)
        rest = rest[: cut if cut >= 0 else len(rest) - (1 if rest.endswith("<") else 0)]
    reading.content += rest
    return _settled(reading, final)


def _settled(reading: Reading, final: bool) -> Reading:
    reading.content = blanks_held(reading.content, final, bool(reading.calls))
    return reading
