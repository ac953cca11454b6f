"""Tool-call formats: which one a model writes (read from its chat template, or named by
GATEWAY_TOOL_PARSER), its parser and the grammars that force calls in it.

- hermes (Qwen2.5, Qwen3, QwQ, Hermes): `<tool_call>{"name": .., "arguments": ..}</tool_call>`
- llama3_json (Llama 3.1-3.3): `{"name": .., "parameters": ..}`, maybe after `<|python_tag|>`
- pythonic (Llama 4): `[get_weather(city="Paris"), now()]`
- mistral (v3 tokenizers: Nemo, ...): `[TOOL_CALLS][{"name": .., "arguments": ..}]`
- mistral_v11 (Mistral Small 3.2, Devstral, Magistral): `[TOOL_CALLS]name[ARGS]{...}`
- qwen3_xml (Qwen3-Coder, Qwen3.5): `<tool_call><function=name><parameter=key>value</parameter>..`
- deepseek_v3 (DeepSeek V3, R1): `<｜tool▁call▁begin｜>function<｜tool▁sep｜>name` and fenced JSON
- deepseek_v31 (DeepSeek V3.1): `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`
- harmony (gpt-oss): `<|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}<|call|>`
"""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Any

from openai_frontend.tools.parsers.deltas import ParsedDelta, ToolCallDelta, ToolParser
from openai_frontend.tools.parsers.family_grammar import (
    CallSyntax,
    forced_family_grammar,
    strict_family_grammar,
)
from openai_frontend.tools.parsers.harmony import read_harmony
from openai_frontend.tools.parsers.hermes import START, HermesToolParser
from openai_frontend.tools.parsers.hermes_grammar import forced_calls_grammar, strict_auto_grammar
from openai_frontend.tools.parsers.json_calls import (
    DEEPSEEK_V3,
    LLAMA3_JSON,
    MISTRAL,
    MISTRAL_V11,
    read_json_calls,
)
from openai_frontend.tools.parsers.pythonic import read_pythonic
from openai_frontend.tools.parsers.qwen3_xml import StringParams, read_qwen3_xml
from openai_frontend.tools.parsers.snapshot import ReadFn, SnapshotToolParser

__all__ = [
    "PARSERS",
    "VLLM_NAMES",
    "ParsedDelta",
    "ToolCallDelta",
    "ToolParser",
    "chosen_parser",
    "forced_grammar",
    "new_parser",
    "parser_for_template",
    "strict_grammar",
    "string_params",
]

HERMES = "hermes"
LLAMA3 = "llama3_json"
PYTHONIC = "pythonic"
MISTRAL_V3 = "mistral"
MISTRAL_ARGS = "mistral_v11"
QWEN3_XML = "qwen3_xml"
DEEPSEEK = "deepseek_v3"
DEEPSEEK_V31 = "deepseek_v31"
HARMONY = "harmony"

_SYNTAX: dict[str, CallSyntax] = {
    LLAMA3: CallSyntax("", '{"name": "{name}", "parameters": ', "}", "; ", ""),
    PYTHONIC: CallSyntax("[", "{name}(", ")", ", ", "]", style="pythonic"),
    MISTRAL_V3: CallSyntax("[TOOL_CALLS][", '{"name": "{name}", "arguments": ', "}", ", ", "]"),
    MISTRAL_ARGS: CallSyntax("", "[TOOL_CALLS]{name}[ARGS]", "", "", ""),
    QWEN3_XML: CallSyntax(
        "", "<tool_call>\n<function={name}>\n", "\n</function>\n</tool_call>", "\n", "", style="qwen_xml"
    ),
    DEEPSEEK: CallSyntax(
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n",
        "\n```<｜tool▁call▁end｜>",
        "\n",
        "<｜tool▁calls▁end｜>",
    ),
    DEEPSEEK_V31: CallSyntax(
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>",
        "<｜tool▁call▁end｜>",
        "",
        "<｜tool▁calls▁end｜>",
    ),
    # One message per call. The grammar ends with the arguments: `<|call|>` is gpt-oss's stop token,
    # which a grammar matcher allows only where the grammar may end, never as its text.
    HARMONY: CallSyntax(
        "",
        "<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>",
        "",
        "<|call|><|start|>assistant",
        "",
    ),
}
PARSERS = (HERMES, *_SYNTAX)
# vLLM's --tool-call-parser names for these formats, accepted as they are.
VLLM_NAMES = {"llama4_json": LLAMA3, "llama4_pythonic": PYTHONIC, "qwen3_coder": QWEN3_XML, "openai": HARMONY}

# What each format's template shows its model, checked in this order (Qwen3-Coder's template also
# writes `<tool_call>`, Mistral v11's also `[TOOL_CALLS]`).
_SIGNS: list[tuple[str, tuple[str, ...]]] = [
    # gpt-oss's template writes `assistant to=` and `functions.` + name apart.
    (HARMONY, ("<|channel|>commentary", "assistant to=")),
    (QWEN3_XML, ("<function=", "<parameter=")),
    (DEEPSEEK, ("tool▁calls▁begin", "```json")),
    (DEEPSEEK_V31, ("tool▁calls▁begin",)),
    (MISTRAL_ARGS, ("[TOOL_CALLS]", "[ARGS]")),
    (MISTRAL_V3, ("[TOOL_CALLS]",)),
    (HERMES, (START,)),
    (PYTHONIC, ("[func_name1(",)),
    (LLAMA3, ("<|python_tag|>",)),
    (LLAMA3, ('"parameters": dictionary of argument name',)),
]


def parser_for_template(template: str | None) -> str | None:
    """The tool-call format a chat template teaches its model, or None when it knows no tools."""
    if template is None or "tool" not in template:  # DeepSeek's templates render no tool list
        return None
    if "<arg_key>" in template:  # GLM's `<tool_call>` holds XML arguments, not Hermes' JSON
        return None
    return next((name for name, signs in _SIGNS if all(s in template for s in signs)), None)


def chosen_parser(setting: str, template: str | None) -> str | None:
    """The format GATEWAY_TOOL_PARSER names: auto reads it from the template, none turns tools off."""
    if setting == "auto":
        return parser_for_template(template)
    return None if setting == "none" else setting


def forced_grammar(parser: str, functions: list[dict[str, Any]], one_call: bool) -> str:
    """EBNF for calls in `parser`'s format and nothing else; raises GrammarError."""
    if parser == HERMES:
        return forced_calls_grammar(functions, one_call)
    return forced_family_grammar(_SYNTAX[parser], functions, one_call)


def strict_grammar(parser: str, functions: list[dict[str, Any]], one_call: bool) -> str:
    """EBNF for `auto` with strict functions in `parser`'s format; raises GrammarError."""
    if parser == HERMES:
        return strict_auto_grammar(functions, one_call)
    return strict_family_grammar(_SYNTAX[parser], functions, one_call)


def string_params(functions: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per function, the parameters whose schema is a string: formats that write values raw
    (Qwen3-Coder's XML) need them to read the values back."""
    found: dict[str, list[str]] = {}
    for function in functions:
        properties = (function.get("parameters") or {}).get("properties") or {}
        keys = [k for k, s in properties.items() if isinstance(s, dict) and s.get("type") == "string"]
        if keys:
            found[function["name"]] = keys
    return found


def new_parser(
    parser: str, req_id: str, max_calls: int | None, strings: StringParams | None = None
) -> ToolParser:
    """A parser for one choice. Its call ids derive from the choice's request id, so a replay (resume,
    fetch by id) names the calls as the first answer did; they reveal nothing of the id."""

    def call_id(index: int) -> str:
        return "call_" + hashlib.sha256(f"{req_id}:{index}".encode()).hexdigest()[:24]

    if parser == HERMES:
        return HermesToolParser(call_id, max_calls)
    readers: dict[str, tuple[ReadFn, str | None]] = {
        LLAMA3: (partial(read_json_calls, LLAMA3_JSON), None),
        PYTHONIC: (read_pythonic, None),
        MISTRAL_V3: (partial(read_json_calls, MISTRAL), None),
        MISTRAL_ARGS: (partial(read_json_calls, MISTRAL_V11), None),
        QWEN3_XML: (partial(read_qwen3_xml, strings or {}), "</tool_call>"),
        DEEPSEEK: (partial(read_json_calls, DEEPSEEK_V3), "<｜tool▁call▁end｜>"),
        DEEPSEEK_V31: (partial(read_json_calls, DEEPSEEK_V3), "<｜tool▁call▁end｜>"),
        HARMONY: (read_harmony, "<|call|>"),
    }
    read, call_end = readers[parser]
    return SnapshotToolParser(read, call_id, max_calls, call_end)
