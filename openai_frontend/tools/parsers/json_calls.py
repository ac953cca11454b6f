"""Tool-call formats whose arguments are the model's own JSON object, between a head that names the
function and a tail: Llama 3's JSON calls, Mistral's `[TOOL_CALLS]` (the JSON list of v3 tokenizers
and the `name[ARGS]{...}` of v11+), DeepSeek V3's and V3.1's tags. Each is data: where calls begin,
a call's head and tail; one reader serves them all (snapshot.py streams it).

As in the Hermes parser: text before the calls is content, the blanks that touch them are not; a call
opens as soon as its head is read and its arguments stream as written, never re-serialized; calls
cut off by max_tokens keep what was written. Text after the calls that no call follows is content,
given at the end (models rarely write any).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import regex

from openai_frontend.tools.parsers.scan import balanced_end
from openai_frontend.tools.parsers.snapshot import Call, Reading, blanks_held

_JSON_NAME = r'(?P<name>"(?:[^"\\]|\\.)*")'


@dataclass(frozen=True, slots=True)
class JsonCallFormat:
    start: regex.Pattern[str]  # where calls begin (searched for; text before it is content)
    head: regex.Pattern[str]  # one call up to its arguments object; group `name`
    tail: regex.Pattern[str]  # after its arguments, to the next call's head
    at_start_only: bool = False  # calls only at the output's start (else the output is content)


LLAMA3_JSON = JsonCallFormat(
    start=regex.compile(r"\A"),
    head=regex.compile(
        r'\s*(?:<\|python_tag\|>\s*)?\{\s*"name"\s*:\s*'
        + _JSON_NAME
        + r'\s*,\s*"(?:parameters|arguments)"\s*:\s*'
    ),
    tail=regex.compile(r"\s*\}\s*(?:;\s*)?"),
    at_start_only=True,
)
MISTRAL = JsonCallFormat(
    start=regex.compile(r"\[TOOL_CALLS\]\s*\["),
    head=regex.compile(r'\s*\{\s*"name"\s*:\s*' + _JSON_NAME + r'\s*,\s*"arguments"\s*:\s*'),
    # Mistral's templates write each call's id after its arguments.
    tail=regex.compile(r'\s*(?:,\s*"id"\s*:\s*"[^"]*"\s*)?\}\s*(?:,|\]\s*)'),
)
MISTRAL_V11 = JsonCallFormat(
    start=regex.compile(r"\[TOOL_CALLS\]"),
    head=regex.compile(r"(?:\[TOOL_CALLS\])?\s*(?P<name>[A-Za-z0-9_.-]+)\[ARGS\]"),
    tail=regex.compile(r"\s*"),
)
DEEPSEEK_V3 = JsonCallFormat(
    start=regex.compile(r"<｜tool▁calls▁begin｜>"),
    # V3: `function<｜tool▁sep｜>name` and a ```json fence; V3.1: `name<｜tool▁sep｜>`, bare JSON.
    head=regex.compile(
        r"\s*<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>(?P<name>[^\n<]+)\n```(?:json)?\n\s*"
        r"|(?!function<)(?P<name>[^<\n]+)<｜tool▁sep｜>\s*)"
    ),
    tail=regex.compile(r"\s*(?:```\s*)?<｜tool▁call▁end｜>\s*(?:<｜tool▁calls▁end｜>\s*)?"),
)


def json_end(text: str, at: int) -> int | None:
    """Where the JSON object starting at `at` ends (just after its `}`); None when the text ends
    first, -1 when no object starts there."""
    if at >= len(text):
        return None
    return balanced_end(text, at) if text[at] == "{" else -1


def _name(literal: str) -> str | None:
    if not literal.startswith('"'):
        return literal.strip()
    try:
        return str(json.loads(literal))
    except json.JSONDecodeError:
        return None


def read_json_calls(fmt: JsonCallFormat, text: str, final: bool) -> Reading:
    """What `text` holds in format `fmt`; see snapshot.py for what a reading promises."""
    searched = 0
    while True:
        start = fmt.start.search(text, searched, partial=True)
        if start is None:
            return Reading(blanks_held(text, final, calls_follow=False))
        held = Reading(text if final else text[: start.start()].rstrip())
        if start.partial:  # the text ends in what may begin the calls
            return held
        reading = _calls(fmt, text, start.end(), final)
        if reading is not None:
            reading.content = text[: start.start()].rstrip() + reading.content
            return reading
        if not final and _undecided(fmt, text, start.end()):
            return held
        if fmt.at_start_only:
            return Reading(blanks_held(text, final, calls_follow=False))
        searched = max(start.end(), start.start() + 1)


def _undecided(fmt: JsonCallFormat, text: str, at: int) -> bool:
    """Whether the text from `at` may still become a call's head."""
    head = fmt.head.match(text, at, partial=True)
    return head is not None and head.partial


def _calls(fmt: JsonCallFormat, text: str, at: int, final: bool) -> Reading | None:
    """The calls from `at`; None when no call's head starts there."""
    calls: list[Call] = []
    while True:
        head = fmt.head.match(text, at, partial=True)
        name = None if head is None or head.partial else _name(head.group("name"))
        if name is None:
            break
        end = json_end(text, head.end())
        if end == -1:
            break
        calls.append(Call(name, text[head.end() : end]))
        if end is None:
            return Reading(calls=calls)
        at = end
        tail = fmt.tail.match(text, end, partial=True)
        if tail is None or tail.partial:
            if tail is not None and not final:
                return Reading(calls=calls)
            break
        at = tail.end()
    if not calls:
        return None
    rest = text[at:]
    return Reading(rest.strip() if final else "", calls)
