"""Prompts whose answers repeat them, the traffic model-free drafts (n-gram, suffix) pay on: a code
edit (a function and the request to rewrite it with one change), a summary that quotes its report,
and an agent's next turn after a tool result it echoes. Built from templates with a seeded RNG (no
downloads), each ends where the answer starts copying, so a model that follows it repeats the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

Encode = Callable[[str], list[int]]

_NAMES = ("total", "count", "items", "result", "values", "index", "buffer", "offset", "limit", "row")
_FUNCS = ("parse_header", "merge_rows", "load_config", "count_words", "find_user", "render_table")
_STATEMENTS = (
    "    {a} = {b} + {n}",
    "    if {a} > {n}:\n        {b} = {a} - {m}",
    "    for {a} in range({n}):\n        {b}.append({a} * {m})",
    "    {a} = [x for x in {b} if x % {n} == 0]",
    '    {a} = {b}.get("{key}", {n})',
    "    while {a} < {n}:\n        {a} += {m}",
)
_CHANGES = (
    "renames the variable `{a}` to `{new}`",
    "uses {m} instead of {n} in its first statement",
    "returns `{b}` instead of `{a}`",
    "has a docstring saying what it returns",
)
_TEAMS = ("storage", "billing", "search", "mobile", "payments", "platform")
_MONTHS = ("March", "April", "May", "June", "July", "August")
_SENTENCES = (
    "The {team} team shipped {n} releases in {month}, {m} more than planned.",
    "Latency of the {team} service fell from {n} ms to {m} ms after the cache was resized.",
    "{n} incidents were opened against {team} in {month}; {m} of them were closed within a day.",
    'The lead of {team} wrote: "we will keep {n} engineers on the migration until {month}."',
    "Costs for {team} rose by {n} percent in {month}, mostly from {m} new replicas.",
)
_TOOLS = ("read_file", "search_issues", "list_orders", "get_weather", "query_db")


def _pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[int(rng.integers(len(options)))]


def _numbers(rng: np.random.Generator) -> dict[str, object]:
    return {"n": int(rng.integers(2, 100)), "m": int(rng.integers(2, 100))}


def _fill(render: Callable[[list[str]], str], piece: Callable[[], str], length: int, encode: Encode) -> str:
    """`render` of as many pieces as keep the prompt within `length` tokens (at least one)."""
    pieces = [piece()]
    while True:
        more = [*pieces, piece()]
        if len(encode(render(more))) > length:
            return render(pieces)
        pieces = more


def _code_edit(rng: np.random.Generator, length: int, encode: Encode) -> str:
    a = _pick(rng, _NAMES)
    b = _pick(rng, tuple(n for n in _NAMES if n != a))
    header = f"def {_pick(rng, _FUNCS)}({b}, {a}=0):"
    first = _numbers(rng)  # the first statement's, which one change names
    change = _pick(rng, _CHANGES).format(a=a, b=b, new=f"new_{a}", **first)
    numbers = iter([first])

    def statement() -> str:
        fill = {**_numbers(rng), "a": a, "b": b, "key": _pick(rng, _NAMES)}
        return _pick(rng, _STATEMENTS).format(**{**fill, **next(numbers, {})})

    def render(lines: list[str]) -> str:
        code = "\n".join([header, *lines, f"    return {a}"])
        return (
            f"Rewrite the function below so that it {change}. Keep everything else exactly as it is.\n\n"
            f"```python\n{code}\n```\n\nThe rewritten function:\n\n```python\n"
        )

    return _fill(render, statement, length, encode)


def _summary(rng: np.random.Generator, length: int, encode: Encode) -> str:
    def sentence() -> str:
        fill = {**_numbers(rng), "team": _pick(rng, _TEAMS), "month": _pick(rng, _MONTHS)}
        return _pick(rng, _SENTENCES).format(**fill)

    def render(sentences: list[str]) -> str:
        return (
            "Summarize the report below in a few sentences, quoting its figures and sentences exactly.\n\n"
            f"Report: {' '.join(sentences)}\n\nSummary: The report says: \u201c"
        )

    return _fill(render, sentence, length, encode)


def _agent_turn(rng: np.random.Generator, length: int, encode: Encode) -> str:
    results: list[str] = []

    def exchange() -> str:
        """A request, the tool call, its result; after the first, the previous result echoed first."""
        tool = _pick(rng, _TOOLS)
        arguments = {"id": int(rng.integers(1000, 9999)), "limit": int(rng.integers(2, 6))}
        rows = [
            {"name": _pick(rng, _NAMES), "team": _pick(rng, _TEAMS), "value": int(rng.integers(0, 1000))}
            for _ in range(arguments["limit"])
        ]
        call = json.dumps({"name": tool, "arguments": arguments})
        lines = [f"assistant: The tool returned {results[-1]}"] if results else []
        results.append(json.dumps({"status": "ok", "rows": rows}))
        lines += [
            f"user: Call {tool} for record {arguments['id']} and tell me what it returns.",
            f"assistant: <tool_call>{call}</tool_call>",
            f"tool: {results[-1]}",
        ]
        return "\n".join(lines)

    def render(exchanges: list[str]) -> str:
        return "\n".join(exchanges) + "\nassistant: The tool returned "

    return _fill(render, exchange, length, encode)


_KINDS = (_code_edit, _summary, _agent_turn)


def repetitive_prompt(kind: int, length: int, encode: Encode, rng: np.random.Generator) -> list[int]:
    """Prompt `kind` (0: code edit, 1: summary, 2: agent turn) of at most `length` tokens (unless one
    piece of it, a statement, a sentence or a tool exchange, is longer), as token ids."""
    return encode(_KINDS[kind % len(_KINDS)](rng, length, encode))
