"""What the worker's greedy output with images must equal: transformers' `generate` on the model's
own processor output for one request alone (fp32, EOS ignored), and the test's prompts and images."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.models.vision import build_vision_model, make_image
from openai_frontend.model.vision_processor import load_vision_processor


def image(seed: int, size: tuple[int, int] = (40, 30)) -> Any:
    """A PIL image of random blocks: each seed (and size) another image."""
    from PIL import Image

    return Image.open(io.BytesIO(make_image(seed, size))).convert("RGB")


def chat_text(processor: Any, question: str, num_images: int) -> str:
    """A user turn with `num_images` images before `question`, rendered by the model's template."""
    content = [{"type": "image"}] * num_images + [{"type": "text", "text": question}]
    text: str = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    return text


def build_model(path: Path, family: str) -> Path:
    """`build_vision_model`'s checkpoint, with the matrices transformers initializes to zero drawn at
    random (Gemma 3's image projection: every image would embed as zeros, and the tests could not
    tell one image, or a misplaced one, from another)."""
    import torch
    from transformers import AutoModelForImageTextToText

    build_vision_model(path, family)
    model = AutoModelForImageTextToText.from_pretrained(path)
    zero = [p for p in model.parameters() if p.dim() == 2 and not bool(p.any())]
    if zero:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in zero:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        model.save_pretrained(path)
    return path


class ReferenceModel:
    """The checkpoint as transformers loads it, with its processor (as the gateway loads it)."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForImageTextToText

        vision = load_vision_processor(model_dir)
        assert vision is not None
        self.vision = vision  # what the gateway and `LLM` run: token ids and MultiModalFeatures
        self.processor = vision.processor
        self.model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()

    def greedy(self, text: str, images: Sequence[Any], max_tokens: int) -> list[int]:
        """`generate`'s tokens for `text` with `images`, alone, greedy, EOS ignored."""
        import torch

        inputs = self.processor(text=[text], images=[list(images)] if images else None, return_tensors="pt")
        inner = self.model.model
        if hasattr(inner, "rope_deltas"):
            inner.rope_deltas = None  # Qwen2.5-VL keeps the last request's M-RoPE delta on the model
        with torch.inference_mode():
            out = self.model.generate(
                **inputs, do_sample=False, max_new_tokens=max_tokens, eos_token_id=None, pad_token_id=0
            )
        return [int(t) for t in out[0, inputs["input_ids"].shape[1] :]]
