"""Tiny random vision-language models saved like hub checkpoints, with the processor beside them.

One builder per family the project serves with images: LLaVA (a CLIP tower and projector in front of
a Llama), Gemma 3 (SigLIP, its soft tokens between start/end of image) and Qwen2.5-VL (dynamic
resolution, M-RoPE). Each is made from transformers' own config classes, small enough for the CPU,
and saved with `save_pretrained` next to its processor (the ChatML BPE with the family's image tokens
as special tokens, the family's image processor at a few dozen pixels, the family's chat template),
so gateway, worker and reference `generate` all read the same files a hub checkpoint has.

Images for the tests are made here too (`make_image`, `data_url`): solid-ish random pictures in any
Pillow format.
"""

from __future__ import annotations

import base64
import io
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.workloads.chatml_tokenizer import (
    config_token_ids,
    fast_tokenizer,
    generation_config,
    train_tokenizer,
)
from harness.models.tiny_model import SMALL, TEMPLATES, VISION_TOWER, _corpus
from openai_frontend.model.vision_processor import images_only

VISION_FAMILIES = ("llava", "gemma3", "qwen2_5_vl")

# The text model's sizes inside each family (the vocabulary is the tokenizer's).
_TEXT = {k: v for k, v in SMALL.items() if k != "vocab_size"}

TEMPLATE_FILES = {"llava": "llava.jinja", "gemma3": "gemma3_vision.jinja", "qwen2_5_vl": "qwen2_5_vl.jinja"}


def chat_template(family: str) -> str:
    """The family's chat template (harness/models/templates/), as its hub checkpoints ship it (llava-1.5-hf,
    gemma-3-4b-it, Qwen2.5-VL-*) on this project's tokens: an image part renders as its placeholder."""
    return (TEMPLATES / TEMPLATE_FILES[family]).read_text(encoding="utf-8")


# The family's image tokens, named as its processor reads them from the tokenizer.
_IMAGE_TOKENS: dict[str, dict[str, str]] = {
    "llava": {"image_token": "<image>"},
    "gemma3": {
        "boi_token": "<start_of_image>",
        "image_token": "<image_soft_token>",
        "eoi_token": "<end_of_image>",
        "sot_token": "<start_of_turn>",
        "eot_token": "<end_of_turn>",
    },
    "qwen2_5_vl": {
        "vision_start_token": "<|vision_start|>",
        "image_token": "<|image_pad|>",
        "vision_end_token": "<|vision_end|>",
        "video_token": "<|video_pad|>",
    },
}


def _tokenizer(family: str, max_len: int) -> tuple[Any, Any]:
    """The ChatML BPE plus the family's image tokens (special), as `tokenizers` and transformers
    objects."""
    from tokenizers import AddedToken

    tok = train_tokenizer(_corpus(), 512)
    names = _IMAGE_TOKENS[family]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in names.values()])
    fast = fast_tokenizer(tok, max_len, chat_template(family), dict(names))
    return tok, fast


def _llava(tok: Any, fast: Any) -> tuple[Any, Any]:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    # 16 patches + CLS; "default" drops CLS, so 16 tokens per image.
    vision = CLIPVisionConfig(**VISION_TOWER)
    text = LlamaConfig(**_TEXT, vocab_size=tok.get_vocab_size(), **config_token_ids(tok))
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.token_to_id("<image>"),
        image_seq_length=16,
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    images = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=fast,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=chat_template("llava"),
    )
    return config, processor


def _gemma3(tok: Any, fast: Any) -> tuple[Any, Any]:
    from transformers import Gemma3Config, Gemma3Processor, Gemma3TextConfig, SiglipVisionConfig
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    # 16 patches, pooled to 4 soft tokens per image.
    vision = SiglipVisionConfig(**VISION_TOWER)
    text = Gemma3TextConfig(
        **{**_TEXT, "num_hidden_layers": 3},
        vocab_size=tok.get_vocab_size(),
        head_dim=16,
        sliding_window=7,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        query_pre_attn_scalar=24,
        **config_token_ids(tok),
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=tok.token_to_id("<start_of_image>"),
        eoi_token_index=tok.token_to_id("<end_of_image>"),
        image_token_index=tok.token_to_id("<image_soft_token>"),
    )
    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32}, do_pan_and_scan=False)
    processor = Gemma3Processor(
        image_processor=images, tokenizer=fast, chat_template=chat_template("gemma3"), image_seq_length=4
    )
    return config, processor


def _qwen2_5_vl(tok: Any, fast: Any) -> tuple[Any, Any]:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    # Patches of 8 merged 2x2: an image of 32x32 px is 4 tokens, one of 64x48 px 12.
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 8,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 32,
        "fullatt_block_indexes": [1],
        "out_hidden_size": SMALL["hidden_size"],
    }
    # head_dim 16: M-RoPE's sections (temporal, height, width) add up to its half.
    text = {
        **_TEXT,
        "vocab_size": tok.get_vocab_size(),
        "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
        **config_token_ids(tok),
    }
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=tok.token_to_id("<|image_pad|>"),
        video_token_id=tok.token_to_id("<|video_pad|>"),
        vision_start_token_id=tok.token_to_id("<|vision_start|>"),
        vision_end_token_id=tok.token_to_id("<|vision_end|>"),
    )
    images = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 32 * 32, "longest_edge": 64 * 64},
        patch_size=8,
        temporal_patch_size=2,
        merge_size=2,
    )
    # Without torchvision no video processor can be made: the processor is made without one.
    processor = images_only(Qwen2_5_VLProcessor)(
        image_processor=images,
        tokenizer=fast,
        video_processor=None,
        chat_template=chat_template("qwen2_5_vl"),
    )
    return config, processor


_BUILDERS: dict[str, Callable[[Any, Any], tuple[Any, Any]]] = {
    "llava": _llava,
    "gemma3": _gemma3,
    "qwen2_5_vl": _qwen2_5_vl,
}


def build_vision_model(path: Path, family: str, *, seed: int = 0, max_len: int = 512) -> Path:
    """A random `family` model (one of VISION_FAMILIES) saved at `path` with its processor: load them
    with `AutoModelForImageTextToText.from_pretrained(path)` and
    `openai_frontend.model.vision_processor.load_processor(path)` (AutoProcessor's, made without a
    video processor when torchvision is missing)."""
    import torch
    from transformers import AutoModelForImageTextToText

    tok, fast = _tokenizer(family, max_len)
    config, processor = _BUILDERS[family](tok, fast)
    config.text_config.max_position_embeddings = max_len
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config)
    # Matrices transformers initializes to zero (Gemma 3's image projection) drawn at random: else every
    # image would embed alike, and a test could not tell one image, or a misplaced one, from another.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2 and not bool(param.any()):
                param.normal_(std=0.5)
    model.generation_config = generation_config(tok)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    _save_processor(processor, path)
    return path


def _save_processor(processor: Any, path: Path) -> None:
    """As `save_pretrained` saves it; one made without a video processor (which it cannot save) as
    its parts and the processor's class, as hub checkpoints of that family keep them."""
    if getattr(processor, "video_processor", ()) is not None:
        processor.save_pretrained(path)
        return
    processor.tokenizer.save_pretrained(path)
    processor.image_processor.save_pretrained(path)
    (path / "chat_template.jinja").write_text(processor.chat_template, encoding="utf-8")
    config = {"processor_class": type(processor).__name__}
    (path / "processor_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def make_image(seed: int, size: tuple[int, int] = (40, 30), fmt: str = "PNG") -> bytes:
    """A `size` (width, height) picture of random blocks, encoded as `fmt`: each seed another image."""
    from PIL import Image

    rng = random.Random(seed)
    image = Image.new("RGB", size)
    block = 8
    for x in range(0, size[0], block):
        for y in range(0, size[1], block):
            color = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
            image.paste(color, (x, y, min(x + block, size[0]), min(y + block, size[1])))
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    """`data` as a data: URL, as clients send an image inline."""
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


if __name__ == "__main__":
    import sys

    for name in VISION_FAMILIES:
        print(build_vision_model(Path(sys.argv[1] if len(sys.argv) > 1 else "models") / f"tiny-{name}", name))
