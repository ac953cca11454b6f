"""Random PEFT LoRA adapters of a tiny base model, saved by PEFT itself (never a hub download).

`init_lora_weights=False` makes lora_B random too, so an adapter changes the model's output (PEFT's
default starts B at zero: a no-op until trained).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from common.lora_adapter import TARGET_MODULES


def build_lora_adapter(
    base_model_dir: Path,
    path: Path,
    *,
    rank: int = 4,
    alpha: int = 8,
    target_modules: Sequence[str] = TARGET_MODULES,
    use_rslora: bool = False,
    seed: int = 0,
) -> Path:
    """An adapter of `base_model_dir` in `path` (adapter_config.json + adapter_model.safetensors)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(target_modules),
        use_rslora=use_rslora,
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    get_peft_model(base, config).save_pretrained(str(path))
    return path
