"""Random PEFT LoRA adapters of a tiny base model, made and run by `peft` itself (never a hub).

`build_lora_adapter` saves one as PEFT saves any (`adapter_config.json` + `adapter_model.safetensors`),
with `init_lora_weights=False` so that B is not zero and the adapter changes the output; `peft_greedy`
is PEFT's own unmerged `generate` for each prompt alone: what the served tokens must equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.gpu_parity import generate_greedy


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter's PEFT LoraConfig: ranks, targets and scaling that differ between the test adapters."""

    name: str
    r: int
    lora_alpha: int
    target_modules: Sequence[str] | str
    use_rslora: bool = False
    rank_pattern: dict[str, int] = field(default_factory=dict)
    seed: int = 0


# Three unlike adapters: attention only, the MLP with rsLoRA and a per-module rank, and all seven linears.
SPECS = (
    AdapterSpec("attn-r4", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], seed=1),
    AdapterSpec(
        "mlp-rslora",
        r=8,
        lora_alpha=4,
        target_modules=["gate_proj", "up_proj", "down_proj"],
        use_rslora=True,
        rank_pattern={"down_proj": 2},
        seed=2,
    ),
    AdapterSpec(
        "all-r16",
        r=16,
        lora_alpha=32,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        seed=3,
    ),
)


def build_lora_adapter(base_dir: Path, path: Path, spec: AdapterSpec) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.lora_alpha,
        target_modules=list(spec.target_modules)
        if not isinstance(spec.target_modules, str)
        else spec.target_modules,
        use_rslora=spec.use_rslora,
        rank_pattern=dict(spec.rank_pattern),
        init_lora_weights=False,  # B random too: the adapter changes the output
        lora_dropout=0.0,
    )
    torch.manual_seed(spec.seed)
    peft_model: Any = get_peft_model(model, config)
    _scale_factors(peft_model)
    peft_model.save_pretrained(path)
    return path


def _scale_factors(peft_model: Any) -> None:
    """PEFT's random factors shrunk so the adapted model stays near its base (as a trained adapter
    does), yet changes its greedy tokens: a delta far larger than the base drowns it."""
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.5)


def build_adapters(base_dir: Path, root: Path, specs: Sequence[AdapterSpec] = SPECS) -> dict[str, Path]:
    """Each spec's adapter under `root/<name>`, by name."""
    return {spec.name: build_lora_adapter(base_dir, root / spec.name, spec) for spec in specs}


def peft_greedy(
    base_dir: Path, adapter_dir: Path | None, prompts: Sequence[list[int]], max_tokens: int | Sequence[int]
) -> list[list[int]]:
    """PEFT's unmerged model (`adapter_dir` None: the base alone) generating greedily for each prompt
    alone, EOS ignored, in float32."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    with torch.no_grad():
        return generate_greedy(model, prompts, max_tokens)
