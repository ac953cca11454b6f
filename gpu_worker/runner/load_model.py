"""Loading the model with paged attention, and sizing the KV cache around it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from gpu_worker.runner.attention.transformers_interface import register_paged_attention
from gpu_worker.runner.forward.compile import compile_decoder, pool_layout
from gpu_worker.runner.forward.decoder import FAMILIES, Decoder
from gpu_worker.runner.forward.linear import check_quantization
from gpu_worker.runner.kv_cache import KVCache
from gpu_worker.runner.lora.layers import LoRAConfig
from gpu_worker.runner.lora.step import LoRAKernel
from gpu_worker.runner.model_support import check_model_supported, head_dim
from gpu_worker.runner.multimodal.architectures import DECODER_FAMILIES, is_vision_language
from gpu_worker.runner.multimodal.vision_model import VisionLanguageModel, load_vision_language, vision_family
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int


# What the runner calls: the worker's own decoder for the families it has one for, else transformers'.
Model = Decoder | PreTrainedModel | VisionLanguageModel


def load_model(settings: WorkerSettings) -> Model:
    """The model on its device, ready for the step's flattened batch: `Decoder` (merged GEMMs,
    WORKER_QUANTIZATION, compiled) for the Llama family, transformers' forward with paged attention
    plugged in for the rest."""
    device = torch.device(settings.device)
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("WORKER_DEVICE=cuda but torch sees no CUDA device: use --device cpu or a CUDA build")
    config = AutoConfig.from_pretrained(settings.model)
    check_model_supported(config)  # before loading any weight
    vision = is_vision_language(config)
    # LLaVA's and Qwen2.5-VL's language model runs on the decoder (multimodal/vision_model.py).
    own_decoder = config.model_type in FAMILIES or (vision and vision_family(config) in DECODER_FAMILIES)
    if settings.enable_lora and (vision or not own_decoder):
        raise ValueError(
            f"WORKER_ENABLE_LORA serves adapters on {', '.join(sorted(FAMILIES))} (the worker's own "
            f"decoder), not {config.model_type}: unset it to serve this model"
        )
    if settings.quantization is not None and not own_decoder:
        raise ValueError(
            f"WORKER_QUANTIZATION={settings.quantization} is implemented for {', '.join(sorted(FAMILIES))}, "
            f"not {config.model_type}: "
            "unset it to serve this model in its own dtype"
        )
    check_quantization(settings.quantization, device)
    attn_implementation = register_paged_attention()
    logger.info("loading the weights of %s", settings.model)
    dtype = getattr(torch, settings.resolved_dtype)
    if vision:
        hf_model = load_vision_language(settings.model, config, dtype, attn_implementation)
        hf_model.to(device)  # type: ignore[arg-type]
        hf_model.eval()
        vlm = VisionLanguageModel(hf_model, settings.quantization)
        if settings.compile and vlm.decoder is not None:
            vlm.decoder.pool_layout = pool_layout(settings)
            compile_decoder(vlm.decoder, Path(settings.compile_cache_dir), device)
        return vlm
    model = AutoModelForCausalLM.from_pretrained(
        settings.model,
        config=config,
        attn_implementation=attn_implementation,
        dtype=dtype,
    )
    # transformers types `.to` through a decorator that mypy misreads; it is nn.Module.to.
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    return worker_forward(model, settings, device)


def worker_forward(model: PreTrainedModel, settings: WorkerSettings, device: torch.device) -> Model:
    """The forward the worker runs for a loaded model: its `Decoder` for the families it implements,
    compiled when WORKER_COMPILE; the model itself else (benchmarks/worker_step/decode_roofline.py times
    this)."""
    if model.config.model_type not in FAMILIES:
        return model
    decoder = Decoder(model, settings.quantization, lora_config(settings, device))
    decoder.pool_layout = pool_layout(settings)
    if settings.compile:
        compile_decoder(decoder, Path(settings.compile_cache_dir), device)
    return decoder


def lora_config(settings: WorkerSettings, device: torch.device) -> LoRAConfig | None:
    """The LoRA slots WORKER_ENABLE_LORA asks for: Triton's grouped kernels on cuda, a dense masked
    matmul elsewhere (gpu_worker/runner/lora/step.py)."""
    if not settings.enable_lora:
        return None
    kernel: LoRAKernel = "triton" if device.type == "cuda" else "dense"
    return LoRAConfig(max_loras=settings.max_loras, max_lora_rank=settings.max_lora_rank, kernel=kernel)


def kv_shape(config: PretrainedConfig) -> KVShape:
    text = config.get_text_config()
    num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    return KVShape(
        num_layers=int(text.num_hidden_layers), num_kv_heads=int(num_kv_heads), head_dim=head_dim(text)
    )


def allocate_kv_cache(
    shape: KVShape, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> KVCache:
    return KVCache.allocate(
        num_layers=shape.num_layers,
        num_blocks=num_blocks,
        block_size=block_size,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        dtype=dtype,
        device=device,
    )


def resolve_num_blocks(
    settings: WorkerSettings, shapes: Sequence[KVShape], dtype: torch.dtype, budget: int
) -> int:
    """WORKER_NUM_BLOCKS, or as many blocks as `budget` bytes hold (see gpu_worker/runner/profile.py), a
    block in the pool of each of `shapes` (the target's, and a draft model's) per block."""
    if settings.num_blocks is not None:
        return settings.num_blocks
    per_block = sum(
        KVCache.bytes_per_block(
            num_layers=shape.num_layers,
            block_size=settings.block_size,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=dtype,
        )
        for shape in shapes
    )
    num_blocks = budget // per_block
    if num_blocks < 1:
        knobs = (
            "raise WORKER_GPU_MEMORY_UTILIZATION, lower WORKER_MAX_NUM_BATCHED_TOKENS or "
            "WORKER_GPU_RESERVE_MEMORY_MB"
            if settings.device == "cuda"
            else "raise WORKER_KV_CACHE_MEMORY_MB"
        )
        raise ValueError(f"no room for one KV block ({per_block} bytes): {knobs}, or set WORKER_NUM_BLOCKS")
    return int(num_blocks)


def model_max_len(config: PretrainedConfig) -> int | None:
    """The model's own context length, when its config says."""
    limit = getattr(config.get_text_config(), "max_position_embeddings", None)
    return int(limit) if limit else None


def resolve_max_model_len(settings: WorkerSettings, config: PretrainedConfig, num_blocks: int) -> int:
    capacity = num_blocks * settings.block_size
    model_limit = model_max_len(config) or capacity
    if settings.max_model_len is None:
        return int(min(model_limit, capacity))
    if settings.max_model_len > capacity:
        raise ValueError(
            f"WORKER_MAX_MODEL_LEN={settings.max_model_len} exceeds the KV cache ({capacity} tokens): "
            "lower it or raise WORKER_NUM_BLOCKS"
        )
    if settings.max_model_len > model_limit:
        logger.warning(
            "max_model_len %d is past the model's %d positions", settings.max_model_len, model_limit
        )
    return settings.max_model_len


def eos_token_ids(model: Model) -> frozenset[int]:
    """EOS ids from both the generation config and the model config (models disagree on which holds them)."""
    ids: set[int] = set()
    generation_config = getattr(model, "generation_config", None)
    for source in (
        getattr(generation_config, "eos_token_id", None),
        model.config.get_text_config().eos_token_id,
    ):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return frozenset(ids)
