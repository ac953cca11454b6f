"""Qwen3-Coder's XML tool calls: `<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n
</function>\n</tool_call>`. A value is raw text for a parameter whose schema is a string, JSON
otherwise (as the template writes it: strings as they are, the rest `tojson`); a value that is not
JSON is read as a string, as vLLM's qwen3_coder parser does. Blanks around a value are dropped.

A call opens at `<function=name>`; its arguments are a JSON object built from the parameters, given
out one whole parameter at a time (`{"key": value`, `, "key2": value`, then `}`), so the pieces still
join exactly to the final arguments.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

import regex

from openai_frontend.tools.parsers.snapshot import Call, Reading, blanks_held

START = "<tool_call>"
_START = regex.compile(regex.escape(START))
_FUNCTION = regex.compile(r"\s*<function=(?P<name>[^>\n]+)>")
_PARAMETER = regex.compile(r"\s*<parameter=(?P<key>[^>\n]+)>")
_PARAMETER_END = "</parameter>"
_FUNCTION_END = regex.compile(r"\s*</function>\s*(?:</tool_call>\s*)?")

# function name -> the parameters whose schema is a string (their values are raw text)
StringParams = Mapping[str, Collection[str]]


def read_qwen3_xml(string_params: StringParams, text: str, final: bool) -> Reading:
    searched = 0
    while True:
        start = _START.search(text, searched, partial=True)
        if start is None:
            return Reading(blanks_held(text, final, calls_follow=False))
        held = Reading(text if final else text[: start.start()].rstrip())
        if start.partial:
            return held
        function = _FUNCTION.match(text, start.end(), partial=True)
        if function is not None and not function.partial:
            reading = _calls(string_params, text, start.start(), final)
            reading.content = text[: start.start()].rstrip() + reading.content
            return reading
        if function is not None and not final:
            return held
        searched = start.end()


def _calls(string_params: StringParams, text: str, at: int, final: bool) -> Reading:
    calls: list[Call] = []
    while True:
        start = _START.match(text, at)
        function = _FUNCTION.match(text, start.end() if start else at, partial=True)
        if function is None or function.partial:
            break
        name = function.group("name").strip()
        call = Call(name, "")
        calls.append(call)
        at = function.end()
        while (parameter := _PARAMETER.match(text, at, partial=True)) is not None and not parameter.partial:
            end = text.find(_PARAMETER_END, parameter.end())
            if end < 0:
                return Reading(calls=calls)
            key = parameter.group("key").strip()
            value = _value(text[parameter.end() : end], key in string_params.get(name, ()))
            call.arguments += ("{" if not call.arguments else ", ") + f"{json.dumps(key)}: {value}"
            at = end + len(_PARAMETER_END)
        close = _FUNCTION_END.match(text, at, partial=True)
        if close is None or close.partial:
            if not final:
                return Reading(calls=calls)
            break
        call.arguments = call.arguments + "}" if call.arguments else "{}"
        at = close.end()
    return Reading(text[at:].strip() if final else "", calls)


def _value(raw: str, is_string: bool) -> str:
    """A parameter's value as JSON text. The blanks around it are not part of it: the template puts
    a newline each side, the forcing grammar allows up to two blanks (xgrammar's qwen_xml style)."""
    raw = raw.strip()
    if not is_string:
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False)
        except (json.JSONDecodeError, RecursionError):
            pass
    return json.dumps(raw, ensure_ascii=False)
