"""Models the worker's forward cannot run are refused at load, naming the architecture and the reason:
those whose layers drop the attention context (Falcon, StableLM), multi-head latent attention whatever
its head sizes, attention features no backend implements. Windows, softcapping and sinks load, and so
does every family the end-to-end tests serve.

Each case is a tiny random model of the real model type, saved and loaded back through
`from_pretrained` as a user's model directory would be.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    BloomConfig,
    CpmAntConfig,
    DeepseekV3Config,
    FalconConfig,
    Gemma2Config,
    Gemma3TextConfig,
    GPT2Config,
    GptOssConfig,
    Llama4TextConfig,
    LlamaConfig,
    MistralConfig,
    MptConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
    Qwen3NextConfig,
    StableLmConfig,
)

from gpu_worker.runner.forward.decoder import FAMILIES as DECODER_FAMILIES
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.runner.model_support import (
    UnsupportedModelError,
    check_model_supported,
    unsupported_attention_features,
    unsupported_features,
)
from gpu_worker.settings import WorkerSettings
from harness.models.family_models import FAMILIES

SMALL = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def save_tiny(path: Path, config: PretrainedConfig) -> Path:
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def load(path: Path, **settings: object) -> ModelRunner:
    return ModelRunner(WorkerSettings(model=str(path), num_blocks=64, worker_id="t", **settings))  # type: ignore[arg-type]


def mla_config(**overrides: int) -> DeepseekV3Config:
    """DeepSeek-V3's multi-head latent attention, tiny; by default with values as wide as the RoPE part
    of the keys, which is also the config's `head_dim`: the sizes a check of `v_head_dim` alone let in."""
    sizes = {"qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8, "kv_lora_rank": 16, **overrides}
    return DeepseekV3Config(
        **{**SMALL, "num_key_value_heads": 4},
        **sizes,
        q_lora_rank=None,
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    )


# Each case: the config, and what the refusal must name.
REFUSED: dict[str, tuple[Callable[[], PretrainedConfig], list[str]]] = {
    # Their decoder layers call attention without the forward's kwargs: the step's context never
    # reaches paged attention (before, they crashed in the profiling step).
    "falcon": (
        lambda: FalconConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
        ["'falcon' (FalconForCausalLM)", "do not pass the step's attention context"],
    ),
    "stablelm": (
        lambda: StableLmConfig(**SMALL),
        ["'stablelm' (StableLmForCausalLM)", "do not pass the step's attention context"],
    ),
    "deepseek-v3-mla": (mla_config, ["'deepseek_v3'", "multi-head latent attention", "keys of 16"]),
    # EmbeddingGemma: Gemma 3 whose attention sees both ways.
    "gemma3-bidirectional": (
        lambda: Gemma3TextConfig(**SMALL, head_dim=8, use_bidirectional_attention=True),
        ["bidirectional attention"],
    ),
    "falcon-alibi": (
        lambda: FalconConfig(
            vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True
        ),
        ["ALiBi"],
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_attention_is_refused_at_load_naming_the_feature(tmp_path: Path, case: str) -> None:
    make_config, features = REFUSED[case]
    path = save_tiny(tmp_path / case, make_config())
    with pytest.raises(UnsupportedModelError) as refused:
        load(path)
    message = str(refused.value)
    assert "not supported" in message
    for feature in features:
        assert feature in message
    # The check reads the config alone: the same refusal before any weight is loaded.
    with pytest.raises(UnsupportedModelError, match="not supported"):
        check_model_supported(AutoConfig.from_pretrained(path))


@pytest.mark.parametrize("sizes", [{}, {"v_head_dim": 16}, {"qk_nope_head_dim": 0, "qk_rope_head_dim": 8}])
def test_multi_head_latent_attention_is_refused_whatever_its_head_sizes(sizes: dict[str, int]) -> None:
    [problem] = unsupported_features(mla_config(**sizes))
    assert "multi-head latent attention" in problem


def _served_configs() -> dict[str, PretrainedConfig]:
    """Every family the end-to-end and family tests serve (harness/models/family_models.py), the
    decoder's own families, the tiny Llama and GPT-2 (transformers' forward)."""
    configs = {name: make() for name, make in FAMILIES.items()}
    configs |= {
        "llama": LlamaConfig(**SMALL),
        "qwen3": Qwen3Config(**SMALL, head_dim=8),
        "qwen2": Qwen2Config(**SMALL),
        "mistral": MistralConfig(**SMALL, sliding_window=None),
        "gpt2": GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4),
        "gemma2-softcap": SERVED["gemma2-softcap"](),
        "gpt-oss-sinks": SERVED["gpt-oss-sinks"](),
    }
    return configs


def test_every_served_family_passes_the_check() -> None:
    configs = _served_configs()
    assert {c.model_type for c in configs.values()} >= DECODER_FAMILIES
    for name, config in configs.items():
        assert unsupported_features(config) == [], name
        check_model_supported(config)


# The decoder's windows: (config, each layer's window).
DECODER_WINDOWS: dict[str, tuple[Callable[[], PretrainedConfig], list[int | None]]] = {
    # Mistral v0.1: one window for every layer, shorter than the context.
    "mistral-sliding-window": (lambda: MistralConfig(**SMALL, sliding_window=64), [64, 64]),
    # Qwen2 with use_sliding_window: the layers from max_window_layers on slide.
    "qwen2-use-sliding-window": (
        lambda: Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=64, max_window_layers=1),
        [None, 64],
    ),
}


@pytest.mark.parametrize("case", list(DECODER_WINDOWS))
def test_llama_family_windows_are_served_by_the_decoder(tmp_path: Path, case: str) -> None:
    config, windows = DECODER_WINDOWS[case]
    runner = load(save_tiny(tmp_path / case, config()))
    assert isinstance(runner.model, Decoder)
    assert [layer.window for layer in runner.model.layers] == windows


SERVED: dict[str, Callable[[], PretrainedConfig]] = {
    # Gemma 2: logit softcapping in every layer, sliding window in every other one.
    "gemma2-softcap": lambda: Gemma2Config(
        **SMALL, head_dim=8, sliding_window=64, attn_logit_softcapping=50.0
    ),
    "gpt-oss-sinks": lambda: GptOssConfig(
        **SMALL, head_dim=8, num_local_experts=2, num_experts_per_tok=1, sliding_window=64
    ),
}


@pytest.mark.parametrize("case", list(SERVED))
def test_softcapping_and_sinks_are_served_by_transformers_forward(tmp_path: Path, case: str) -> None:
    # Families outside the decoder's run transformers' forward, which passes each layer's window,
    # softcap and sinks to paged attention.
    runner = load(save_tiny(tmp_path / case, SERVED[case]()))
    assert isinstance(runner.model, PreTrainedModel)


def test_a_window_longer_than_every_sequence_is_full_attention(tmp_path: Path) -> None:
    # Capped at the window, sliding-window attention never slides: the decoder's full attention is exact.
    path = save_tiny(tmp_path / "mistral", MistralConfig(**SMALL, sliding_window=64))
    runner = load(path, max_model_len=64)
    assert runner.max_model_len == 64
    assert isinstance(runner.model, Decoder)


@pytest.mark.parametrize(
    "config",
    [
        lambda: MistralConfig(**SMALL, sliding_window=None),  # Mistral v0.2 and later
        lambda: Qwen2Config(**SMALL, sliding_window=64),  # the window is off unless use_sliding_window
    ],
    ids=["mistral-no-window", "qwen2-window-off"],
)
def test_models_with_plain_attention_load(tmp_path: Path, config: Callable[[], PretrainedConfig]) -> None:
    assert load(save_tiny(tmp_path / "model", config())).num_blocks == 64


def test_the_tiny_llama_loads(tiny_model_dir: Path) -> None:
    assert load(tiny_model_dir).num_blocks == 64


@pytest.mark.parametrize(
    ("config", "feature"),
    [
        (DeepseekV3Config, "multi-head latent attention"),
        (MptConfig, "ALiBi"),
        (BloomConfig, "ALiBi"),
        (Llama4TextConfig, "chunked_attention layers"),
        (Qwen3NextConfig, "linear_attention layers"),
        (CpmAntConfig, "relative position biases"),
    ],
)
def test_default_configs_of_other_unsupported_model_types_name_their_feature(
    config: Callable[[], PretrainedConfig], feature: str
) -> None:
    [problem] = unsupported_attention_features(config())
    assert feature in problem
    assert unsupported_attention_features(LlamaConfig()) == []
