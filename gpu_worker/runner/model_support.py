"""What the worker's forward can run, read from the config at load, before any weight: a model it
cannot serve is refused by name at once, instead of crashing in the profiling step or serving wrong text.

The check is positive where the forward's reach is known, so an architecture nobody looked at is
refused too:
- The architecture: the step's `AttentionContext` reaches paged attention only as a forward kwarg
  (gpu_worker/runner/attention/transformers_interface.py), so every module between `model(...)` and
  attention must pass kwargs on. transformers marks the models that do (`_supports_attention_backend`,
  which vLLM's Transformers backend requires too); the decoder's own families (forward/decoder.py) are
  among them. Falcon and StableLM are not: their decoder layers drop the kwargs.
- The layer kinds: full and sliding-window attention (gpu_worker/runner/attention/variant.py also
  implements logit softcapping and attention sinks).
- The KV layout: the pool holds keys and values of one head size, `head_dim`. Multi-head latent
  attention (DeepSeek V2/V3 and their kin) is refused whatever its head sizes: it caches a latent, and
  its keys are `qk_nope_head_dim + qk_rope_head_dim` wide while its config's `head_dim` is the RoPE part.

Within those models, features transformers hands to the attention function as kwargs that paged
attention would ignore are refused by name (`indices` for sparse attention, `position_bias`; the model
lists below come from a scan of transformers' `attention_interface(...)` calls), and so are position
biases and bidirectional attention.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from gpu_worker.runner.multimodal.architectures import is_vision_language, unsupported_vision

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
    """The worker's forward cannot run the model (gpu_worker/__main__.py exits with the message)."""


def check_model_supported(config: PretrainedConfig) -> None:
    """Raise UnsupportedModelError naming the architecture and every reason the forward cannot run it."""
    problems = unsupported_features(config)
    if problems:
        model_type = config.get_text_config().model_type or config.model_type
        model_class = None if is_vision_language(config) else causal_lm_class(config)
        named = f"{model_type!r}" + ("" if model_class is None else f" ({model_class.__name__})")
        raise UnsupportedModelError(
            f"model type {named} is not supported: {'; '.join(problems)}. cbserve's worker runs only "
            "models whose attention it implements: serving this one would crash or generate wrong text"
        )


def unsupported_features(config: PretrainedConfig) -> list[str]:
    """Why the forward cannot run `config`'s model; empty when it can."""
    architecture = unsupported_architecture(config)
    features = [f"its attention uses {problem}" for problem in unsupported_attention_features(config)]
    return ([] if architecture is None else [architecture]) + features


def unsupported_architecture(config: PretrainedConfig) -> str | None:
    """Why the step's attention context cannot reach the model's attention; None when it can."""
    vision = unsupported_vision(config)
    if vision is not None or is_vision_language(config):
        return vision  # a vision-language model's language model runs on the worker's decoder
    model_class = causal_lm_class(config)
    if model_class is None:
        return "transformers has no causal language model for it"
    if not model_class.is_backend_compatible():
        return (
            f"its layers do not pass the step's attention context on to attention (transformers does "
            f"not mark {model_class.__name__} as supporting attention backends)"
        )
    return None


def causal_lm_class(config: PretrainedConfig) -> type[PreTrainedModel] | None:
    """The class `AutoModelForCausalLM.from_pretrained` builds for `config`, if transformers has one."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    return model_class if isinstance(model_class, type) and issubclass(model_class, PreTrainedModel) else None


def unsupported_attention_features(config: PretrainedConfig) -> list[str]:
    """The attention features of `config` no paged attention backend implements."""
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
    layout = _kv_layout_problem(text)
    if layout is not None:
        problems.append(layout)
    return problems


def _kv_layout_problem(text: PretrainedConfig) -> str | None:
    """Why the layers' keys and values do not fit the pool (heads of `head_dim`); None when they do."""
    size = head_dim(text)
    value_size = getattr(text, "v_head_dim", None) or size
    if getattr(text, "kv_lora_rank", None) is not None:
        key_size = getattr(text, "qk_head_dim", None) or (
            getattr(text, "qk_nope_head_dim", 0) + getattr(text, "qk_rope_head_dim", 0)
        )
        return (
            f"multi-head latent attention (kv_lora_rank={text.kv_lora_rank}: keys of {key_size} and "
            f"values of {value_size} per head, decompressed from a cached latent)"
        )
    if value_size != size:
        return f"keys and values of different head sizes ({size} and {value_size})"
    return None


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
