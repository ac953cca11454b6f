"""Prompt token ids and images of a chat conversation for a vision-language model: the multimodal
counterpart of prompts.py's `chat_prompt_ids`.

Every message's content goes to the chat template as parts (`{"type": "text", "text": ...}` and
`{"type": "image"}`), as transformers' processors pass them and the families' templates read them;
the template writes each image's placeholder and the model's own processor (ServedModel.vision)
expands it and makes the image's tensors. Images are counted before any is fetched, and each is
fetched (openai_frontend/media/fetch.py) and decoded and checked (media/decode.py) before anything
is queued. Special-token strings in a client's text would be read as control tokens (an image
placeholder among them) by the processor's tokenizer, so they are refused unless the operator allows
them (GATEWAY_CHAT_CONTENT_SPECIAL_TOKENS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image

from common.protocol import MultiModalFeature
from openai_frontend.generate.prompts import message_dict, text_part
from openai_frontend.media.decode import decode_image
from openai_frontend.media.fetch import image_bytes
from openai_frontend.model.chat_template import ChatRender, ChatTemplateError, render_chat
from openai_frontend.model.served_model import ServedModel
from openai_frontend.model.vision_processor import VisionProcessor, VisionProcessorError
from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.openai_schemas import ChatMessage, ContentPart
from openai_frontend.tools.history import client_tool_texts

# OpenAI's image_url object: the URL, and `detail`, which a processor of fixed resolution cannot honour
# otherwise than it does (vLLM ignores it too).
_IMAGE_URL_FIELDS = {"url", "detail"}
_DETAILS = (None, "auto", "low", "high")


@dataclass(slots=True, frozen=True)
class ChatPrompt:
    token_ids: list[int]
    mm_features: list[MultiModalFeature] | None = None  # its images in prompt order; None: none


@dataclass(slots=True, frozen=True)
class _ImageRef:
    url: str
    param: str  # where the request holds it, for errors


def has_image_parts(messages: list[ChatMessage]) -> bool:
    """Whether any message holds an image part (its preparation fetches and decodes: a thread's work)."""
    return any(
        isinstance(m.content, list) and any(p.type == "image_url" for p in m.content) for m in messages
    )


def _image_ref(i: int, j: int, part: ContentPart) -> _ImageRef:
    param = f"messages[{i}].content[{j}].image_url"
    image_url = part.image_url
    if image_url is None or not isinstance(image_url.get("url"), str):
        raise invalid_request("an image_url part needs image_url.url (a data: or http(s) URL)", param)
    extra = sorted(set(image_url) - _IMAGE_URL_FIELDS)
    if extra:
        raise invalid_request(f"image_url.{extra[0]} is not supported", f"{param}.{extra[0]}")
    if image_url.get("detail") not in _DETAILS:
        raise invalid_request("image_url.detail is auto, low or high", f"{param}.detail")
    if part.text is not None:
        raise invalid_request("an image_url part cannot carry text", f"messages[{i}].content[{j}].text")
    return _ImageRef(image_url["url"], f"{param}.url")


def _parts(i: int, message: ChatMessage, images: list[_ImageRef]) -> list[dict[str, Any]] | None:
    """The message's content as template parts; its images appended to `images`."""
    content = message.content
    if content is None:
        return None if message.role != "assistant" else []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if part.type == "image_url":
            images.append(_image_ref(i, j, part))
            parts.append({"type": "image"})
        else:
            parts.append({"type": "text", "text": text_part(i, j, part)})
    return parts


def image_chat_prompt(
    messages: list[ChatMessage],
    served: ServedModel,
    vision: VisionProcessor,
    tools: list[dict[str, Any]] | None = None,
    render: ChatRender | None = None,
    add_special_tokens: bool | None = None,
) -> ChatPrompt:
    """The conversation's prompt for a vision-language model: token ids with every image's
    placeholders expanded, and each image's feature. `add_special_tokens` None: as transformers'
    processor renders a chat, the tokenizer's own (a BOS) unless the template begins with it."""
    template = vision.chat_template or served.tokenizer.chat_template
    if template is None:
        raise invalid_request("this model has no chat template; use /v1/completions", "messages")
    if not messages:
        raise invalid_request("messages must not be empty", "messages")
    refs: list[_ImageRef] = []
    chat = [message_dict(i, m, _parts(i, m, refs)) for i, m in enumerate(messages)]
    rules = served.rules.media
    if len(refs) > rules.limit_images:
        raise invalid_request(
            f"{len(refs)} images in one request; this server accepts at most {rules.limit_images} "
            "(GATEWAY_LIMIT_MM_PER_PROMPT)",
            "messages",
            "too_many_images",
        )
    if not served.rules.special_tokens_in_content:
        _check_client_texts(chat, tools, served)
    images = [decode_image(image_bytes(r.url, rules, r.param), rules, r.param) for r in refs]
    try:
        text = render_chat(
            template, chat, special_tokens=served.tokenizer.special_tokens, tools=tools, render=render
        )
    except ChatTemplateError as exc:
        raise invalid_request(f"the chat template rejected the messages: {exc}", "messages") from exc
    return _processed(vision, text, images, served, add_special_tokens)


def _check_client_texts(
    chat: list[dict[str, Any]], tools: list[dict[str, Any]] | None, served: ServedModel
) -> None:
    tokenizer = served.tokenizer
    for i, message in enumerate(chat):
        texts = [p["text"] for p in message["content"] if p["type"] == "text"]
        for field in ("name", "tool_call_id", "reasoning_content", "thinking"):
            if isinstance(message.get(field), str):
                texts.append(message[field])
        if any(tokenizer.has_special_text(t) for t in texts):
            raise invalid_request(
                "the message holds a special token's text, which this vision-language model's processor "
                "would read as a control token",
                f"messages[{i}]",
            )
    for param, text in client_tool_texts(chat, tools):
        if tokenizer.has_special_text(text):
            raise invalid_request(f"{param} holds a special token's text", param)


def _processed(
    vision: VisionProcessor, text: str, images: list[Image.Image], served: ServedModel, add: bool | None
) -> ChatPrompt:
    bos = served.tokenizer.special_tokens.get("bos_token")
    if add is None:
        add = not (bos and text.startswith(bos))
    try:
        token_ids, features = vision.process(text, images, add)
    except VisionProcessorError as exc:
        raise invalid_request(
            f"the model's processor refused the prompt's images: {exc}", "messages", "invalid_image"
        ) from None
    if not token_ids:
        raise invalid_request("the messages render to an empty prompt", "messages")
    return ChatPrompt(token_ids, features or None)
