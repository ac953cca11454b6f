"""Attention features the paged backends do not implement: refused at load, never served as wrong text.

Sliding windows (one for every layer, or alternating local and global layers), logit softcapping and
attention sinks are implemented (gpu_worker/attention_variant.py). What is not: features transformers
hands to the attention function as kwargs paged attention would ignore (`indices` for sparse
attention, `position_bias`; the model lists below come from a scan of transformers'
`attention_interface(...)` calls), layers of other kinds (linear attention, chunked local attention),
position biases, bidirectional attention, and layouts the KV pool does not have (K and V of different
head sizes: multi-head latent attention). Read from the config, before any weight is loaded.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

# Models that add a learned relative-position bias to the scores (transformers passes `position_bias`).
_POSITION_BIAS_MODELS = frozenset({"cpmant", "inkling", "inkling2", "inkling2_loop"})
# Models whose attention reads only the KV positions an indexer picks (transformers passes `indices`).
_SPARSE_MODELS = frozenset(
    {
        "deepseek_v32",
        "glm_moe_dsa",
        "axk2",
        "dots3_note",
        "hy_v4",
        "hy_v4_vl",
        "mistral_large4",
        "minimax_m3_vl",
    }
)
_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


class UnsupportedModelError(ValueError):
    """The model's attention needs a feature the paged attention backends do not implement."""


def check_attention_supported(config: PretrainedConfig) -> None:
    """Raise UnsupportedModelError naming every unsupported feature `config` uses."""
    problems = unsupported_attention_features(config)
    if problems:
        model_type = config.get_text_config().model_type or config.model_type
        raise UnsupportedModelError(
            f"model type {model_type!r} is not supported: its attention uses {'; '.join(problems)}, "
            "which cbserve's paged attention does not implement (it would generate wrong text)"
        )


def unsupported_attention_features(config: PretrainedConfig) -> list[str]:
    text = config.get_text_config()
    model_type = str(text.model_type or config.model_type)
    layer_types = list(getattr(text, "layer_types", None) or [])
    problems = [f"{kind} layers" for kind in sorted(set(layer_types) - _LAYER_TYPES)]
    if getattr(text, "use_bidirectional_attention", False):  # EmbeddingGemma: not a causal LM
        problems.append("bidirectional attention (use_bidirectional_attention)")
    if model_type in _SPARSE_MODELS:
        problems.append("sparse attention over indexer-selected positions")
    if model_type in _POSITION_BIAS_MODELS:
        problems.append("relative position biases")
    if _uses_alibi(text, model_type):
        problems.append("ALiBi position biases")
    if getattr(text, "attention_chunk_size", None) and "chunked_attention" not in layer_types:
        problems.append(f"chunked local attention (attention_chunk_size={text.attention_chunk_size})")
    v_head_dim = getattr(text, "v_head_dim", None)
    if v_head_dim is not None and v_head_dim != head_dim(text):
        problems.append("keys and values of different head sizes (multi-head latent attention)")
    return problems


def _uses_alibi(text: PretrainedConfig, model_type: str) -> bool:
    attn_config: Any = getattr(text, "attn_config", None)  # MPT: an object or a plain dict
    in_attn_config = (
        attn_config.get("alibi", False)
        if isinstance(attn_config, dict)
        else getattr(attn_config, "alibi", False)
    )
    return bool(
        model_type == "bloom"
        or getattr(text, "alibi", False)
        or in_attn_config
        or getattr(text, "position_embedding_type", None) == "alibi"
    )


def head_dim(text: PretrainedConfig) -> int:
    """Size of one attention head of keys (and, here, values)."""
    return int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
