"""vLLM's prompt dicts with images: `{"prompt": text, "multi_modal_data": {"image": images}}` or
`{"prompt_token_ids": ids, ...}`, run through the model's own processor as the gateway runs a chat's
image parts (openai_frontend/model/vision_processor.py), so the placeholders expand as the model's do.

The text (or the ids, decoded with their special tokens, which are then not added again) holds the
family's image placeholder once per image, as its chat template writes it: LLaVA's `<image>`, Gemma
3's `<start_of_image>`, Qwen2.5-VL's `<|vision_start|><|image_pad|><|vision_end|>`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common.protocol import MultiModalFeature
from openai_frontend.model.vision_processor import VisionProcessor


def multimodal_prompt(
    prompt: str | Sequence[int],
    data: Any,
    processor: VisionProcessor | None,
    decode: Callable[[list[int]], str],
) -> tuple[list[int], list[MultiModalFeature]]:
    """The expanded prompt ids and image features of a prompt dict's `multi_modal_data`; `decode`
    turns ids into the processor's text."""
    if not isinstance(data, Mapping) or set(data) - {"image"}:
        keys = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        raise ValueError(f'multi_modal_data holds "image" (a PIL image or a list of them); got {keys}')
    if processor is None:
        raise ValueError("this model takes no images: it is not a vision-language model the worker serves")
    images = data["image"]
    images = list(images) if isinstance(images, Sequence) and not isinstance(images, str) else [images]
    if isinstance(prompt, str):
        return processor.process(prompt, images, add_special_tokens=True)
    # The ids hold their special tokens already: read back as text, none is added again.
    return processor.process(decode(list(prompt)), images, add_special_tokens=False)
