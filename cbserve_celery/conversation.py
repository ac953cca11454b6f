"""A `cbserve.generate` task's prompt given as a conversation: chat messages (text, and image_url parts
for a vision-language model) rendered by the gateway's own prompt builder, with the model's template
and, for a vision-language model, its processor, so the request is the one `/v1/chat/completions`
would queue for the same messages (images as data: URLs; this worker fetches no image URL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from openai_frontend.generate.image_prompts import ChatPrompt
from openai_frontend.generate.request_builder import chat_prompt_of
from openai_frontend.model.served_model import ModelRules, ServedModel
from openai_frontend.model.tokenizer import ModelTokenizer, read_max_model_len
from openai_frontend.model.vision_processor import VisionProcessor
from openai_frontend.protocol.errors import OpenAIError
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest


def is_conversation(prompt: object) -> bool:
    """A list of message objects (not token ids, not text)."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


def conversation_prompt(
    messages: list[dict[str, Any]], model_dir: Path, tokenizer: ModelTokenizer, vision: VisionProcessor | None
) -> ChatPrompt:
    """The prompt and images of `messages` for the model at `model_dir`; ValueError when refused."""
    max_model_len = read_max_model_len(model_dir)
    if max_model_len is None:
        raise ValueError(f"{model_dir}/config.json declares no context length")
    served = ServedModel(
        ModelRules(name=model_dir.name, max_model_len=max_model_len), str(model_dir), tokenizer, vision
    )
    try:
        return chat_prompt_of(ChatCompletionRequest.model_validate({"messages": messages}), served)
    except ValidationError as exc:
        raise ValueError(f"invalid messages: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}") from None
    except OpenAIError as exc:
        where = f" ({exc.param})" if exc.param else ""
        raise ValueError(f"{exc.message}{where}") from None
