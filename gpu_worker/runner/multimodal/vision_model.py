"""A vision-language model as the worker runs it: the vision tower and projector through transformers'
own modules, once per image; the language model fed the step's input embeddings with each image's
embeddings at its placeholder tokens (vLLM's `get_multimodal_embeddings` then `get_input_embeddings`).

LLaVA's and Qwen2.5-VL's language model runs on the worker's `Decoder`; Gemma 3's on transformers'
forward with paged attention plugged in, as the Gemma 3 text model does. The families are chosen
from the checkpoint's `architectures` (architectures.py); others are refused at load by name.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from gpu_worker.runner.attention.backend import AttentionContext
from gpu_worker.runner.forward.decoder import Decoder, DecoderOutput
from gpu_worker.runner.multimodal.architectures import (
    BIDIRECTIONAL_FAMILIES,
    DECODER_FAMILIES,
    VISION_ARCHITECTURES,
    VisionFamily,
    vision_architecture,
)
from gpu_worker.settings import Quantization


def vision_family(config: PretrainedConfig) -> VisionFamily:
    architecture = vision_architecture(config)
    assert architecture in VISION_ARCHITECTURES, architecture
    return VISION_ARCHITECTURES[architecture]


def load_vision_language(
    model_dir: str, config: PretrainedConfig, dtype: torch.dtype, attn_implementation: str
) -> PreTrainedModel:
    """The checkpoint as its own transformers class: paged attention in its language model (which
    Gemma 3 runs through transformers), SDPA in its vision tower (a whole image at once, no cache)."""
    family = vision_family(config)
    name = next(n for n, f in VISION_ARCHITECTURES.items() if f == family)
    attention = {"": attn_implementation, "text_config": attn_implementation, "vision_config": "sdpa"}
    model: PreTrainedModel = getattr(transformers, name).from_pretrained(
        model_dir, config=config, attn_implementation=attention, dtype=dtype
    )
    return model


class VisionLanguageModel(nn.Module):
    """Called as the runner calls a `Decoder`, with `inputs_embeds` (mm_step.py builds them with
    `embed`) in place of ids; `encode` runs one image through the vision tower and projector."""

    def __init__(self, hf_model: PreTrainedModel, quantization: Quantization | None) -> None:
        super().__init__()
        self.family = vision_family(hf_model.config)
        inner: Any = hf_model.model  # LlavaModel, Qwen2_5_VLModel, Gemma3Model
        self.decoder: Decoder | None = None
        self.language: Any = None  # Gemma 3: the whole transformers model, its forward run as is
        if self.family in DECODER_FAMILIES:
            self.decoder = Decoder(hf_model, quantization, language_model=inner.language_model)
            # The text model's layers live on in the decoder's merged weights: drop transformers' copies.
            inner.language_model = nn.Module()
            self.embed_tokens: nn.Module = self.decoder.embed_tokens
        else:
            self.language = hf_model
            self.embed_tokens = hf_model.get_input_embeddings()  # Gemma 3's scales by sqrt(hidden)
        self.vision = inner
        self.config = hf_model.config
        self.dtype = hf_model.dtype
        self.generation_config = hf_model.generation_config
        self.vocab_size = int(self.config.get_text_config().vocab_size)
        self.mrope = self.decoder is not None and self.decoder.mrope
        # Qwen2.5-VL's patches per embedding side (M-RoPE positions of an image's grid).
        self.spatial_merge_size = int(getattr(self.config.vision_config, "spatial_merge_size", 1))
        # Gemma 3: an image's tokens attend to all of their image (its run computed in one chunk).
        self.bidirectional_images = self.family in BIDIRECTIONAL_FAMILIES

    @property
    def lora_config(self) -> None:
        return None  # WORKER_ENABLE_LORA is refused for these (load_model.py)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [T, hidden] of ids [T] (placeholders included: they are overwritten)."""
        # An image token id past the vocabulary (Gemma 3's may be) embeds as id 0 until overwritten.
        safe = torch.where(input_ids < self.vocab_size, input_ids, torch.zeros_like(input_ids))
        embeddings: torch.Tensor = self.embed_tokens(safe)
        return embeddings

    def encode(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        """One image's embeddings [its placeholder tokens, hidden] from its processor outputs."""
        pixel_values = data["pixel_values"].to(self.dtype)
        if self.family == "qwen2_5_vl":
            out = self.vision.get_image_features(pixel_values, data["image_grid_thw"], return_dict=True)
        else:
            out = self.vision.get_image_features(pixel_values=pixel_values, return_dict=True)
        features = out.pooler_output
        merged = torch.cat(list(features), dim=0) if isinstance(features, list | tuple) else features
        return merged.reshape(-1, merged.shape[-1]).to(self.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: torch.Tensor | int,
        attn_metadata: AttentionContext,
        use_cache: bool = False,
        inputs_embeds: torch.Tensor | None = None,
    ) -> Any:
        """As `Decoder.forward`; without `inputs_embeds` (the profiling step), ids embedded as text."""
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids[0]).unsqueeze(0)
        if self.decoder is None:
            # transformers' forward from the embeddings: no pixel_values, so no image is merged twice.
            return self.language(
                inputs_embeds=inputs_embeds,
                position_ids=position_ids,
                logits_to_keep=logits_to_keep,
                attn_metadata=attn_metadata,
                use_cache=use_cache,
            )
        if self.mrope and position_ids.dim() == 2:
            position_ids = position_ids.unsqueeze(-1).expand(-1, -1, 3)  # text only: three equal rows
        out: DecoderOutput = self.decoder(
            input_ids,
            position_ids,
            logits_to_keep,
            attn_metadata,
            use_cache=use_cache,
            inputs_embeds=inputs_embeds,
        )
        return out
