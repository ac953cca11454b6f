"""Attention features the paged backends do not implement: refused at load, never served as wrong text.

transformers hands such features to the attention function as kwargs (`sliding_window`, `softcap`,
`s_aux` / `sinks`, `indices` for sparse attention, `position_bias`) that paged attention would ignore
(the model lists below come from a scan of transformers' `attention_interface(...)` calls), or encodes
them in a layout the KV pool does not have (K and V of different head sizes). Read from the config,
before any weight is loaded.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

# Models whose attention adds learned sink logits (transformers passes `s_aux` / `sinks`).
_SINK_MODELS = frozenset(
    {
        "gpt_oss",
        "deepseek_v4",
        "flint",
        "granite_swa",
        "granitemoe_swa",
        "hy_v4",
        "hy_v4_vl",
        "mimo_v2_flash",
        "inkling2",
        "inkling2_loop",
    }
)
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
_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})  # the sliding ones are checked below


class UnsupportedModelError(ValueError):
    """The model's attention needs a feature the paged attention backends do not implement."""


def check_attention_supported(config: PretrainedConfig, max_model_len: int | None) -> None:
    """Raise UnsupportedModelError naming every unsupported feature `config` uses.

    `max_model_len` is WORKER_MAX_MODEL_LEN: a sliding window at least that long never slides, so
    full attention is exact and the model is served.
    """
    problems = unsupported_attention_features(config, max_model_len)
    if problems:
        model_type = config.get_text_config().model_type or config.model_type
        raise UnsupportedModelError(
            f"model type {model_type!r} is not supported: its attention uses {'; '.join(problems)}, "
            "which cbserve's paged attention does not implement (it would generate wrong text)"
        )


def unsupported_attention_features(config: PretrainedConfig, max_model_len: int | None) -> list[str]:
    text = config.get_text_config()
    model_type = str(text.model_type or config.model_type)
    layer_types = list(getattr(text, "layer_types", None) or [])
    problems = [f"{kind} layers" for kind in sorted(set(layer_types) - _LAYER_TYPES)]
    problems += _sliding_window(text, layer_types, max_model_len)
    if getattr(text, "attn_logit_softcapping", None) is not None:
        problems.append(f"attention logit softcapping (attn_logit_softcapping={text.attn_logit_softcapping})")
    if model_type in _SINK_MODELS:
        problems.append("attention sinks")
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


def _sliding_window(text: PretrainedConfig, layer_types: list[str], max_model_len: int | None) -> list[str]:
    window = getattr(text, "sliding_window", None)
    if layer_types:
        sliding = "sliding_attention" in layer_types
    else:  # Mistral-style: one window for every layer; Qwen2-style configs can switch it off
        sliding = window is not None and getattr(text, "use_sliding_window", True) is not False
    if not sliding:
        return []
    # A window covering the longest sequence never slides: full attention is then exact.
    longest = max_model_len or getattr(text, "max_position_embeddings", None)
    if window is not None and longest is not None and longest <= window:
        return []
    return [
        f"sliding-window attention (window {window} tokens; WORKER_MAX_MODEL_LEN={window} "
        "or less would serve it exactly)"
    ]


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
