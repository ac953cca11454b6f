"""Prompt token ids from a completion prompt or a chat conversation."""

from __future__ import annotations

from typing import Any

from openai_frontend.chat_content import encode_chat
from openai_frontend.chat_template import ChatTemplateError, render_chat
from openai_frontend.errors import invalid_request
from openai_frontend.openai_schemas import ChatMessage
from openai_frontend.served_model import ServedModel
from openai_frontend.validation import check_token_ids

CHAT_ROLES = ("system", "user", "assistant")
_NON_TEXT_PART_FIELDS = ("image_url", "input_audio", "file", "refusal")


def completion_prompt_ids(
    prompt: str | list[int] | list[str] | list[list[int]], served: ServedModel
) -> list[int]:
    """Text is tokenized with the tokenizer's own special tokens (e.g. BOS); ids are taken as given."""
    # A batch of one is the same as a single prompt; larger batches need n-way fan-out, not here yet.
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise invalid_request("only one prompt per request is supported", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid_request("prompt must not be empty", "prompt")
        token_ids = served.tokenizer.encode(prompt, add_special_tokens=True)
    else:
        token_ids = [int(t) for t in prompt]  # type: ignore[arg-type]  # narrowed to list[int] above
        check_token_ids(token_ids, served, "prompt")
    if not token_ids:
        raise invalid_request("prompt must not be empty", "prompt")
    return token_ids


def _message_dict(i: int, message: ChatMessage) -> dict[str, Any]:
    if message.role not in CHAT_ROLES:
        raise invalid_request(
            f"role {message.role!r} is not supported; use one of {', '.join(CHAT_ROLES)}",
            f"messages[{i}].role",
        )
    content = message.content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if part.type != "text" or part.text is None:
                raise invalid_request(
                    f"content part type {part.type!r} is not supported; only text parts are",
                    f"messages[{i}].content",
                )
            extra = next((f for f in _NON_TEXT_PART_FIELDS if getattr(part, f) is not None), None)
            if extra is not None:
                raise invalid_request(
                    f"a text content part cannot carry {extra}", f"messages[{i}].content[{j}].{extra}"
                )
            texts.append(part.text)
        # Templates expect a string; vLLM joins text parts the same way.
        content = "\n".join(texts)
    if content is None:
        if message.role != "assistant":
            raise invalid_request(f"a {message.role} message needs content", f"messages[{i}].content")
        content = ""
    return {"role": message.role, "content": content, "name": message.name}


def chat_prompt_ids(messages: list[ChatMessage], served: ServedModel) -> list[int]:
    """Render the chat template (it carries its own special tokens) and tokenize without adding more;
    special-token strings in the messages are text unless the operator allows them (see chat_content)."""
    tokenizer = served.tokenizer
    if tokenizer.chat_template is None:
        raise invalid_request("this model has no chat template; use /v1/completions", "messages")
    if not messages:
        raise invalid_request("messages must not be empty", "messages")
    chat = [_message_dict(i, m) for i, m in enumerate(messages)]
    try:
        if served.special_tokens_in_content:  # the operator trusts clients with control tokens
            text = render_chat(
                tokenizer.chat_template,
                chat,
                special_tokens=tokenizer.special_tokens,
                add_generation_prompt=True,
            )
            token_ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            token_ids = encode_chat(tokenizer, chat, tokenizer.chat_template)
    except ChatTemplateError as exc:
        raise invalid_request(f"the chat template rejected the messages: {exc}", "messages") from exc
    if not token_ids:
        raise invalid_request("the messages render to an empty prompt", "messages")
    return token_ids
