"""Chat templates rendered the way transformers renders them, without importing transformers.

Hub templates are untrusted code: they run in jinja's immutable sandbox with the same globals and filters
transformers provides (`raise_exception`, `strftime_now`, `tojson`, `dict`, `namespace`, `{% generation %}`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the conversation (e.g. `raise_exception('roles must alternate')`)."""


@dataclass(slots=True, frozen=True)
class ChatRender:
    """How a conversation is rendered, as a request's template controls ask (vLLM's names)."""

    add_generation_prompt: bool = True  # end with the assistant's turn header
    continue_final_message: bool = False  # end inside the last message, so the model continues it
    variables: Mapping[str, Any] = field(default_factory=dict)  # chat_template_kwargs and the like


class _GenerationTag(jinja2.ext.Extension):
    # transformers tracks assistant spans with `{% generation %}`; rendering only needs the body.
    tags = {"generation"}  # noqa: RUF012 - jinja reads it as a class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: jinja2.runtime.Macro) -> str:
        return str(caller())


class _TemplateNamespace(jinja2.utils.Namespace):
    # As in transformers: namespaces reject underscore names so templates cannot reach CPython internals.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


class _TemplateDict:
    # `dict(...)` inside templates, without exposing the dict type itself.
    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson escapes HTML characters, which would change the prompt.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(template)


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    special_tokens: dict[str, str],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    render: ChatRender | None = None,
) -> str:
    """The prompt text for `messages` (and `tools`, the request's tool objects, as transformers passes
    them); raises ChatTemplateError when the template rejects them. `render`, when given, decides the
    generation prompt instead of `add_generation_prompt`."""
    # Like transformers: keys whose value is None are dropped, since templates handle a missing key better.
    chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
    render = render or ChatRender(add_generation_prompt=add_generation_prompt)
    try:
        compiled = _compile(template)
        text = compiled.render(
            **render.variables,
            messages=chat,
            tools=tools,
            documents=None,
            add_generation_prompt=render.add_generation_prompt,
            **special_tokens,
        )
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(str(exc)) from exc
    return _cut_after_final(text, chat) if render.continue_final_message else text


def _cut_after_final(text: str, chat: list[dict[str, Any]]) -> str:
    """The rendering cut right after the last message's content, as transformers'
    `continue_final_message` cuts it: the model then continues that message."""
    final = chat[-1].get("content") if chat else None
    if isinstance(final, list):  # a vision-language model's parts: its last text part is continued
        final = next((p.get("text") for p in reversed(final) if p.get("type") == "text"), None)
    if not isinstance(final, str) or not final.strip() or final.strip() not in text:
        raise ChatTemplateError("continue_final_message needs a last message whose text the template writes")
    at = text.rindex(final.strip())
    # The template kept the message's spacing: keep it too; else cut after the stripped text.
    end = len(final.lstrip()) if text[at : at + len(final.lstrip())] == final.lstrip() else len(final.strip())
    return text[: at + end]


@lru_cache(maxsize=8)
def template_reads(template: str) -> frozenset[str]:
    """The variables a template reads from its context (`reasoning_effort`, `enable_thinking`, ...)."""
    env = ImmutableSandboxedEnvironment(extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))


def check_template(template: str) -> None:
    """Fail at startup, not on the first chat request, when the model's template does not compile."""
    _compile(template)
