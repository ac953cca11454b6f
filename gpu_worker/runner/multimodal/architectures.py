"""Which vision-language checkpoints the worker serves with images, read from the config alone
(model_support.py checks them before any weight is loaded)."""

from __future__ import annotations

from typing import Literal

from transformers import PretrainedConfig

VisionFamily = Literal["llava", "qwen2_5_vl", "gemma3"]

# transformers' class of each checkpoint architecture served with images, and its family here.
VISION_ARCHITECTURES: dict[str, VisionFamily] = {
    "LlavaForConditionalGeneration": "llava",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Gemma3ForConditionalGeneration": "gemma3",
}
# Families whose language model runs on the worker's Decoder (forward/decoder.py), and the text model
# types it runs there; Gemma 3's runs transformers' forward with paged attention, as its text model does.
DECODER_FAMILIES = frozenset({"llava", "qwen2_5_vl"})
VISION_TEXT_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen2_5_vl_text"})
# Families whose image tokens attend to every token of their own image (Gemma 3): an image's run is
# computed in one chunk, its queries seeing up to the run's end (gpu_worker/runner/multimodal/).
BIDIRECTIONAL_FAMILIES = frozenset({"gemma3"})


def vision_architecture(config: PretrainedConfig) -> str | None:
    """The checkpoint's architecture when its config has a vision part; None for a text model."""
    if getattr(config, "vision_config", None) is None:
        return None
    architectures = list(getattr(config, "architectures", None) or [])
    if architectures:
        return str(architectures[0])
    # A config built in code names no architecture: the family's, by its model type.
    by_type: dict[str, str] = {family: name for name, family in VISION_ARCHITECTURES.items()}
    return by_type.get(config.model_type, type(config).__name__)


def is_vision_language(config: PretrainedConfig) -> bool:
    """Whether the worker serves `config`'s model with images (the architectures above)."""
    return vision_architecture(config) in VISION_ARCHITECTURES


def unsupported_vision(config: PretrainedConfig) -> str | None:
    """Why a checkpoint with a vision part cannot be served; None when it can (or has none)."""
    architecture = vision_architecture(config)
    if architecture is None:
        return None
    if architecture not in VISION_ARCHITECTURES:
        served = ", ".join(sorted(VISION_ARCHITECTURES))
        return f"vision-language architecture {architecture} is not served (images are served with {served})"
    text_type = config.get_text_config().model_type
    if VISION_ARCHITECTURES[architecture] in DECODER_FAMILIES and text_type not in VISION_TEXT_MODEL_TYPES:
        runs = ", ".join(sorted(VISION_TEXT_MODEL_TYPES))
        return f"{architecture} with a {text_type} language model (the worker's decoder runs {runs})"
    return None
