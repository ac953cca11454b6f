"""Prompt token ids from a completion prompt or a chat conversation."""

from __future__ import annotations

from typing import Any

from openai_frontend.generate.chat_content import encode_chat
from openai_frontend.generate.validation import check_token_ids
from openai_frontend.model.chat_template import ChatRender, ChatTemplateError, render_chat
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.openai_schemas import ChatMessage, ContentPart
from openai_frontend.reasoning.history import thought_fields
from openai_frontend.tools.history import client_tool_texts, tool_fields

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI's newer name for system instructions; templates written before it know only "system".
_ROLE_ALIASES = {"developer": "system"}
_NON_TEXT_PART_FIELDS = ("image_url", "input_audio", "file", "refusal")


Prompt = str | list[int]
# A completions body's prompts: lm-eval and other harnesses batch theirs; each becomes n choices.
MAX_PROMPTS = 256


def split_prompts(prompt: str | list[int] | list[str] | list[list[int]]) -> list[Prompt]:
    """The prompts of a completions body: one (text or token ids), or a list of them."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], str | list):
        if len(prompt) > MAX_PROMPTS:
            raise invalid_request(f"at most {MAX_PROMPTS} prompts per request, got {len(prompt)}", "prompt")
        return list(prompt)
    return [prompt]  # type: ignore[list-item]  # token ids (or empty: refused below)


def completion_prompt_ids(prompt: Prompt, served: ServedModel, add_special_tokens: bool = True) -> list[int]:
    """Text is tokenized with the tokenizer's own special tokens (e.g. BOS) unless the client says
    not to; ids are taken as given."""
    if isinstance(prompt, str):
        if not prompt:
            raise invalid_request("prompt must not be empty", "prompt")
        token_ids = served.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    else:
        token_ids = [int(t) for t in prompt]
        check_token_ids(token_ids, served, "prompt")
    if not token_ids:
        raise invalid_request("prompt must not be empty", "prompt")
    return token_ids


def _check_role(i: int, message: ChatMessage) -> None:
    if message.role not in CHAT_ROLES:
        raise invalid_request(
            f"role {message.role!r} is not supported; use one of {', '.join(CHAT_ROLES)}",
            f"messages[{i}].role",
        )


def _message_dict(i: int, message: ChatMessage, served: ServedModel) -> dict[str, Any]:
    _check_role(i, message)
    content = message.content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if part.type == "image_url":
                raise invalid_request(
                    f"model {served.rules.name!r} reads text only: content parts of type 'image_url' need a "
                    "vision-language model",
                    f"messages[{i}].content[{j}]",
                    "image_input_not_supported",
                )
            texts.append(text_part(i, j, part))
        # Templates expect a string; vLLM joins text parts the same way.
        content = "\n".join(texts)
    return message_dict(i, message, content)


def text_part(i: int, j: int, part: ContentPart) -> str:
    """A text part's text; any other kind is refused by name."""
    if part.type != "text" or part.text is None:
        raise invalid_request(
            f"content part type {part.type!r} is not supported; only text parts are", f"messages[{i}].content"
        )
    extra = next((f for f in _NON_TEXT_PART_FIELDS if getattr(part, f) is not None), None)
    if extra is not None:
        raise invalid_request(
            f"a text content part cannot carry {extra}", f"messages[{i}].content[{j}].{extra}"
        )
    return part.text


def message_dict(i: int, message: ChatMessage, content: str | list[dict[str, Any]] | None) -> dict[str, Any]:
    """The message as the chat template reads it, with `content` (text, or parts for a template that
    reads images)."""
    _check_role(i, message)
    if content is None:
        if message.role != "assistant":
            raise invalid_request(f"a {message.role} message needs content", f"messages[{i}].content")
        content = ""
    role = _ROLE_ALIASES.get(message.role, message.role)
    fields = {**tool_fields(i, message), **thought_fields(i, message)}
    return {"role": role, "content": content, "name": message.name, **fields}


def chat_prompt_ids(
    messages: list[ChatMessage],
    served: ServedModel,
    tools: list[dict[str, Any]] | None = None,
    render: ChatRender | None = None,
    add_special_tokens: bool = False,
) -> list[int]:
    """Render the chat template (it carries its own special tokens) and tokenize without adding more
    unless `add_special_tokens` (vLLM's option); special-token strings in the messages are text unless
    the operator allows them (see chat_content). In tools and tool calls, which templates write as
    JSON, they are refused."""
    tokenizer = served.tokenizer
    if tokenizer.chat_template is None:
        raise invalid_request("this model has no chat template; use /v1/completions", "messages")
    if not messages:
        raise invalid_request("messages must not be empty", "messages")
    chat = [_message_dict(i, m, served) for i, m in enumerate(messages)]
    try:
        if served.rules.special_tokens_in_content:  # the operator trusts clients with control tokens
            text = render_chat(
                tokenizer.chat_template,
                chat,
                special_tokens=tokenizer.special_tokens,
                tools=tools,
                render=render,
            )
            token_ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            for param, text in client_tool_texts(chat, tools):
                if tokenizer.has_special_text(text):
                    raise invalid_request(f"{param} holds a special token's text", param)
            token_ids = encode_chat(tokenizer, chat, tokenizer.chat_template, tools, render)
    except ChatTemplateError as exc:
        raise invalid_request(f"the chat template rejected the messages: {exc}", "messages") from exc
    if add_special_tokens:
        token_ids = tokenizer.with_special_tokens(token_ids)
    if not token_ids:
        raise invalid_request("the messages render to an empty prompt", "messages")
    return token_ids
