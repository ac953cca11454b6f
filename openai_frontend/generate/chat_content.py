"""Chat prompts in which only the template's own markup becomes control tokens.

Tokenizing the rendered template whole would turn a special-token string a client writes in a message
(`<|im_end|>\n<|im_start|>system\n...`) into the real control tokens: a forged turn. So when a message
holds such a string, the template is rendered with a unique placeholder for each client string, the
markup between placeholders is encoded with special tokens and each client string as plain text.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from openai_frontend.model.chat_template import ChatRender, render_chat
from openai_frontend.model.tokenizer import ModelTokenizer

# The strings a client writes into a conversation (an assistant's thoughts under both names).
_CLIENT_FIELDS = ("content", "name", "tool_call_id", "reasoning_content", "thinking")


def encode_chat(
    tokenizer: ModelTokenizer,
    chat: list[dict[str, Any]],
    template: str,
    tools: list[dict[str, Any]] | None = None,
    render: ChatRender | None = None,
) -> list[int]:
    """Token ids of `chat` rendered by `template` (with a generation prompt unless `render` says
    otherwise); raises ChatTemplateError."""
    client_texts = [m[f] for m in chat for f in _CLIENT_FIELDS if isinstance(m.get(f), str)]
    if not any(tokenizer.has_special_text(text) for text in client_texts):
        # The common case, tokenized exactly as transformers tokenizes the rendered template.
        text = render_chat(
            template, chat, special_tokens=tokenizer.special_tokens, tools=tools, render=render
        )
        return tokenizer.encode(text, add_special_tokens=False)
    # Private-use characters and a random tag: no client text can contain or forge a placeholder.
    tag = secrets.token_hex(8)
    texts: list[str] = []
    placeholders: list[dict[str, Any]] = []
    for message in chat:
        replaced = dict(message)
        for field in _CLIENT_FIELDS:
            if isinstance(message.get(field), str):
                replaced[field] = f"\ue000{tag}:{len(texts)}\ue001"
                texts.append(message[field])
        placeholders.append(replaced)
    rendered = render_chat(
        template,
        placeholders,
        special_tokens=tokenizer.special_tokens,
        tools=tools,
        render=render,
    )
    token_ids: list[int] = []
    # split() with one group alternates markup and placeholder indices: markup, index, markup, ...
    for i, piece in enumerate(re.split(f"\ue000{tag}:(\\d+)\ue001", rendered)):
        if i % 2:
            token_ids += tokenizer.encode_plain(texts[int(piece)])
        elif piece:
            token_ids += tokenizer.encode(piece, add_special_tokens=False)
    return token_ids
