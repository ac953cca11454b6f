"""Images end to end (HTTP -> gateway's processor -> Redis -> batcher -> worker's vision encoder):
for tiny random LLaVA, Gemma 3 and Qwen2.5-VL models, chat requests with one and two images, streamed,
sent concurrently with text-only requests, give the greedy tokens transformers' `generate` gives on
the processor's output for each request alone (fp32)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from PIL import Image

from harness.models.vision import VISION_FAMILIES, data_url, make_image
from harness.processes.services import running_stack
from openai_frontend.model.vision_processor import load_processor

MAX_TOKENS = 6
IMAGES = [make_image(21, (40, 30)), make_image(22, (64, 48))]
# Each user message's content, an image named by its index in IMAGES; every other case is streamed.
CASES: list[list[dict[str, Any]]] = [
    [{"type": "text", "text": "What is in the picture?"}, {"type": "image", "index": 0}],
    [
        {"type": "image", "index": 0},
        {"type": "text", "text": "And this one?"},
        {"type": "image", "index": 1},
    ],
    [{"type": "text", "text": "Tell me a story about a cat."}],
    [{"type": "image", "index": 1}, {"type": "text", "text": "Describe it."}],
    [{"type": "text", "text": "What is the capital of France?"}],
]


def _openai_content(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The case's content as chat sends it: each image as a data: URL."""
    parts = []
    for part in content:
        if part["type"] == "image":
            part = {"type": "image_url", "image_url": {"url": data_url(IMAGES[part["index"]])}}
        parts.append(part)
    return parts


def reference(model_dir: Path) -> list[list[int]]:
    """Each case alone through transformers: the processor's chat template and tensors, then the
    model's own greedy `generate`, EOS ignored (as the requests ask)."""
    import torch
    from transformers import AutoModelForImageTextToText

    processor = load_processor(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    outputs = []
    for content in CASES:
        hf = [
            {"type": "image", "image": Image.open(io.BytesIO(IMAGES[p["index"]])).convert("RGB")}
            if p["type"] == "image"
            else p
            for p in content
        ]
        inputs = processor.apply_chat_template(
            [{"role": "user", "content": hf}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        if hasattr(model.model, "rope_deltas"):
            model.model.rope_deltas = None  # Qwen2.5-VL keeps the last request's M-RoPE delta
        with torch.inference_mode():
            out = model.generate(
                **inputs, do_sample=False, max_new_tokens=MAX_TOKENS, eos_token_id=None, pad_token_id=0
            )
        outputs.append(out[0, inputs["input_ids"].shape[1] :].tolist())
    return outputs


async def _one(
    client: openai.AsyncOpenAI, model: str, content: list[dict[str, Any]], stream: bool
) -> list[int]:
    """One case through the OpenAI SDK: its generated token ids (vLLM's return_token_ids)."""
    request: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": _openai_content(content)}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "extra_body": {"ignore_eos": True, "return_token_ids": True},
    }
    if not stream:
        answer = await client.chat.completions.create(**request)
        return list((answer.choices[0].model_extra or {})["token_ids"])
    token_ids: list[int] = []
    async for chunk in await client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            token_ids += (choice.model_extra or {}).get("token_ids") or []
    return token_ids


async def run_cases(base_url: str, model: str) -> list[list[int]]:
    """Every case at once, every other one streamed."""
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as client:
        return await asyncio.gather(*(_one(client, model, c, i % 2 == 0) for i, c in enumerate(CASES)))


@pytest.mark.parametrize("family", VISION_FAMILIES)
def test_images_greedy_matches_generate(
    family: str, vision_model_dirs: Callable[[str], Path], tmp_path: Path
) -> None:
    model_dir = vision_model_dirs(family)
    expected = reference(model_dir)
    # 64 tokens per step: the longer prompts prefill in chunks, images never split across them.
    with running_stack(tmp_path, model_dir, batcher_env={"BATCHER_MAX_NUM_BATCHED_TOKENS": "64"}) as stack:
        got = asyncio.run(run_cases(stack.base_url, model_dir.name))
    assert got == expected
