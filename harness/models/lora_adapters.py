"""Random PEFT LoRA adapters of a tiny base model, saved by PEFT itself (never a hub download), and
PEFT's own unmerged `generate` with one: what the served tokens must equal.

`init_lora_weights=False` makes lora_B random too, so an adapter changes the model's output (PEFT's
default starts B at zero: a no-op until trained).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.workloads.make_lora import build_lora_adapter
from common.lora.lora_adapter import TARGET_MODULES


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter's LoraConfig: ranks, targets and scaling that differ between the test adapters."""

    name: str
    rank: int
    alpha: int
    target_modules: Sequence[str]
    use_rslora: bool = False
    rank_pattern: dict[str, int] = field(default_factory=dict)
    seed: int = 0


# Three unlike adapters: attention only, the MLP with rsLoRA and a per-module rank, and all seven linears.
SPECS = (
    AdapterSpec("attn-r4", rank=4, alpha=8, target_modules=["q_proj", "v_proj"], seed=1),
    AdapterSpec(
        "mlp-rslora",
        rank=8,
        alpha=4,
        target_modules=["gate_proj", "up_proj", "down_proj"],
        use_rslora=True,
        rank_pattern={"down_proj": 2},
        seed=2,
    ),
    AdapterSpec("all-r16", rank=16, alpha=32, target_modules=TARGET_MODULES, seed=3),
)


def build_adapters(base_dir: Path, root: Path, specs: Sequence[AdapterSpec] = SPECS) -> dict[str, Path]:
    """Each spec's adapter under `root/<name>`, by name."""
    return {
        spec.name: build_lora_adapter(
            base_dir,
            root / spec.name,
            rank=spec.rank,
            alpha=spec.alpha,
            target_modules=spec.target_modules,
            use_rslora=spec.use_rslora,
            rank_pattern=spec.rank_pattern,
            seed=spec.seed,
        )
        for spec in specs
    }


def peft_greedy(
    base_dir: Path, adapter_dir: Path | None, prompts: Sequence[list[int]], max_tokens: int | Sequence[int]
) -> list[list[int]]:
    """PEFT's unmerged model (`adapter_dir` None: the base alone) generating greedily for each prompt
    alone, EOS ignored, in float32."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from benchmarks.gpu.gpu_parity import generate_greedy

    model: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    with torch.no_grad():
        return generate_greedy(model, prompts, max_tokens)
