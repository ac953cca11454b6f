"""Tiny random models of the families whose attention differs from Llama's, saved like hub models.

Each is built from transformers' own config class for the family, small enough for the CPU, with a
window of WINDOW tokens where the family has one, so the test prompts (up to 40 tokens, prefilled in
chunks) slide past it. The Llama-family models the worker's own decoder serves are built in
tests/unit/gpu_worker/test_decoder.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3Config,
    Gemma3TextConfig,
    GptOssConfig,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
    Qwen3MoeConfig,
    SiglipVisionConfig,
)

from harness.models.tiny_model import SMALL, VISION_TOWER

WINDOW = 7  # tokens: shorter than most test prompts, not a multiple of the block size

FAMILIES: dict[str, Callable[[], PretrainedConfig]] = {
    # Local and global layers alternating, logit softcapping (large enough to bend the scores), the
    # query pre-attention scalar, final logit softcapping.
    "gemma2": lambda: Gemma2Config(
        **SMALL,
        head_dim=16,
        sliding_window=WINDOW,
        attn_logit_softcapping=1.0,
        final_logit_softcapping=30.0,
        query_pre_attn_scalar=24,
    ),
    # Two local layers per global one (the pattern as old configs spell it), a different RoPE theta
    # for local layers, q/k norms.
    "gemma3": lambda: Gemma3TextConfig(
        **{**SMALL, "num_hidden_layers": 3},
        head_dim=16,
        sliding_window=WINDOW,
        sliding_window_pattern=3,
        query_pre_attn_scalar=24,
    ),
    # Gemma 3 as its 4B and larger checkpoints ship: the text model inside an image-text one (a tiny
    # vision tower, never given an image here).
    "gemma3_vlm": lambda: Gemma3Config(
        text_config=FAMILIES["gemma3"]().to_dict(),
        vision_config=SiglipVisionConfig(**VISION_TOWER).to_dict(),
        mm_tokens_per_image=4,
        boi_token_index=509,
        eoi_token_index=510,
        image_token_index=511,
    ),
    # Attention sinks in every layer, local and global layers alternating, a mixture of experts.
    "gpt_oss": lambda: GptOssConfig(
        **SMALL, head_dim=16, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2
    ),
    # Mistral v0.1: one window for every layer (served by the worker's decoder).
    "mistral": lambda: MistralConfig(**SMALL, sliding_window=WINDOW),
    # Qwen2 with use_sliding_window: the layers from max_window_layers on slide (the decoder's too).
    "qwen2_window": lambda: Qwen2Config(
        **SMALL, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    ),
    # Fused qkv and gate/up projections, partial RoPE settings of its own.
    "phi3": lambda: Phi3Config(**SMALL, pad_token_id=0, eos_token_id=1, bos_token_id=2),
    "qwen3_moe": lambda: Qwen3MoeConfig(
        **SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
    ),
}


def save_family(path: Path, family: str, seed: int = 0) -> Path:
    """A random model of `family` saved at `path`; gpt-oss's sinks drawn large enough to matter (its
    initializer draws them at the weights' small scale)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(FAMILIES[family]())
    for layer in getattr(model.model, "layers", []):
        sinks = getattr(layer.self_attn, "sinks", None)
        if sinks is not None:
            torch.nn.init.normal_(sinks, std=2.0)
    model.save_pretrained(path)
    return path
