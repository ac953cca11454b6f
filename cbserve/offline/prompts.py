"""What `LLM.generate` and `LLM.chat` accept, as token ids: tokenized and templated by the gateway's code.

Text is tokenized with the tokenizer's own special tokens (its BOS, say) and ids are checked against
the vocabulary, as `/v1/completions` does; a conversation goes through `/v1/chat/completions`' own
rendering (template controls, tools), with special-token strings in messages read as control tokens,
as transformers' `apply_chat_template` reads them (the gateway's GATEWAY_CHAT_CONTENT_SPECIAL_TOKENS):
offline, whoever writes the messages runs the model.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from cbserve.offline.mm_prompts import multimodal_prompt
from common.protocol import MultiModalFeature
from openai_frontend.generate.prompts import completion_prompt_ids
from openai_frontend.generate.request_builder import prompt_ids_of
from openai_frontend.model.served_model import ModelRules, ServedModel
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.model.vision_processor import VisionProcessor
from openai_frontend.protocol.errors import OpenAIError
from openai_frontend.protocol.openai_schemas import ChatCompletionRequest

# One prompt as vLLM's LLM.generate takes it: text, token ids, {"prompt": text}, {"prompt_token_ids": ids}.
PromptType = str | Sequence[int] | Mapping[str, Any]
Conversation = Sequence[Mapping[str, Any]]


@dataclass(slots=True, frozen=True)
class Prompt:
    text: str | None  # as given, or a conversation's rendered template; None for token ids
    token_ids: list[int]
    mm_features: list[MultiModalFeature] | None = None  # its images (a vision-language model's)


def served_model(model_dir: Path, tokenizer_dir: Path, max_model_len: int) -> ServedModel:
    rules = ModelRules(name=str(model_dir), max_model_len=max_model_len, special_tokens_in_content=True)
    return ServedModel(rules=rules, root=str(model_dir), tokenizer=ModelTokenizer(tokenizer_dir))


def generate_prompts(
    prompts: PromptType | Sequence[PromptType], served: ServedModel, processor: VisionProcessor | None = None
) -> list[Prompt]:
    """One prompt or a list of them (text, token ids, or vLLM's prompt dicts, with images through
    `processor`, a vision-language model's, in "multi_modal_data")."""
    one = isinstance(prompts, str | Mapping) or (
        isinstance(prompts, Sequence) and bool(prompts) and isinstance(prompts[0], int)
    )
    listed = [cast(PromptType, prompts)] if one else cast(Sequence[PromptType], prompts)
    if not listed:
        raise ValueError("no prompts given")
    return [_prompt(prompt, served, processor) for prompt in listed]


def _prompt(prompt: PromptType, served: ServedModel, processor: VisionProcessor | None) -> Prompt:
    if isinstance(prompt, Mapping):
        keys = set(prompt) - {"multi_modal_data"}
        extra = sorted(keys - {"prompt", "prompt_token_ids"})
        if extra or len(keys) != 1:
            raise ValueError(
                'a prompt dict holds one key, "prompt" (text) or "prompt_token_ids" (token ids), and '
                f'"multi_modal_data" (images) if it has any; got {sorted(prompt)}'
            )
        data = prompt.get("multi_modal_data")
        prompt = prompt.get("prompt", prompt.get("prompt_token_ids"))
        if data is not None and isinstance(prompt, str | Sequence):
            decode = partial(served.tokenizer.decode, skip_special_tokens=False)
            ids, features = multimodal_prompt(prompt, data, processor, decode)
            return Prompt(prompt if isinstance(prompt, str) else None, ids, features)
    if not isinstance(prompt, str | Sequence):
        raise ValueError(f"a prompt is text or token ids, not {type(prompt).__name__}")
    with _as_value_error():
        ids = completion_prompt_ids(prompt if isinstance(prompt, str) else list(prompt), served)
    return Prompt(prompt if isinstance(prompt, str) else None, ids)


def chat_prompts(
    messages: Conversation | Sequence[Conversation],
    served: ServedModel,
    *,
    chat_template: str | None,
    add_generation_prompt: bool,
    continue_final_message: bool,
    chat_template_kwargs: Mapping[str, Any] | None,
    tools: Sequence[Mapping[str, Any]] | None,
) -> list[Prompt]:
    """One conversation (a list of message dicts) or a list of them, rendered as the chat endpoint
    renders a body with these fields; `chat_template` replaces the model's."""
    one = bool(messages) and isinstance(messages[0], Mapping)
    conversations = [cast(Conversation, messages)] if one else cast(Sequence[Conversation], messages)
    if chat_template is not None:
        tokenizer = copy.copy(served.tokenizer)
        tokenizer.chat_template = chat_template
        served = dataclasses.replace(served, tokenizer=tokenizer)
    fields = {
        "add_generation_prompt": add_generation_prompt,
        "continue_final_message": continue_final_message,
        "chat_template_kwargs": None if chat_template_kwargs is None else dict(chat_template_kwargs),
        "tools": None if tools is None else [dict(tool) for tool in tools],
    }
    prompts = []
    for conversation in conversations:
        body = ChatCompletionRequest.model_validate({"messages": [dict(m) for m in conversation], **fields})
        with _as_value_error():
            ids = prompt_ids_of(body, served)
        prompts.append(Prompt(served.tokenizer.decode(ids, skip_special_tokens=False), ids))
    return prompts


@contextlib.contextmanager
def _as_value_error() -> Iterator[None]:
    """The front end's refusals (an HTTP 400 there) as the ValueError a Python API raises."""
    try:
        yield
    except OpenAIError as exc:
        where = f" ({exc.param})" if exc.param else ""
        raise ValueError(f"{exc.message}{where}") from None
