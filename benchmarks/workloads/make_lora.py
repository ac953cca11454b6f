"""Random PEFT LoRA adapters of a benchmark model, saved by PEFT itself (adapter_config.json +
adapter_model.safetensors), for the adapter comparison (benchmarks/specs/cpu-lora.toml):

python -m benchmarks.workloads.make_lora models/gpt2-small-llama models/gpt2-small-loras --count 4 --rank 16

Adapter i is `lora<i>` under the output folder, on every linear of every layer, with its own seed.
`init_lora_weights=False` makes lora_B random too, so an adapter changes the model's output (PEFT's
default starts B at zero: a no-op until trained).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.lora.lora_adapter import TARGET_MODULES


def build_lora_adapter(
    base_model_dir: Path,
    path: Path,
    *,
    rank: int = 4,
    alpha: int = 8,
    target_modules: Sequence[str] = TARGET_MODULES,
    use_rslora: bool = False,
    rank_pattern: Mapping[str, int] | None = None,
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
        rank_pattern=dict(rank_pattern or {}),
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    get_peft_model(base, config).save_pretrained(str(path))
    return path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("base_model", type=Path)
    parser.add_argument("output", type=Path, help="folder that receives lora0, lora1, ...")
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=int, default=32)
    args = parser.parse_args(argv)
    for i in range(args.count):
        path = build_lora_adapter(
            args.base_model, args.output / f"lora{i}", rank=args.rank, alpha=args.alpha, seed=i
        )
        print(path)


if __name__ == "__main__":
    main()
