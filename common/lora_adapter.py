"""Whether a PEFT LoRA adapter can run on a base model, read from its files alone (no torch).

PEFT saves `adapter_config.json` and `adapter_model.safetensors`; this reads the config and the
safetensors header (the tensors' names and shapes, never their data) and checks them against the
base model's `config.json`: targets among the attention and MLP projections, each tensor's shape what
the base layer needs, the rank at most `max_lora_rank`. A refusal is a ValueError whose message says
what is wrong, so a gateway can answer it as a 400 and no worker ever meets a bad adapter.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The linear layers an adapter may wrap (Llama's names, shared by most decoder families).
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# A safetensors header larger than this is no adapter's (PEFT's hold a few hundred entries).
_MAX_HEADER_BYTES = 64 * 1024 * 1024
# `...layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight`, PEFT's naming of a wrapped linear.
_TENSOR = re.compile(r"\.layers\.(\d+)\.[a-z_]+\.([a-z_]+)\.lora_([AB])(?:\.[a-z_]+)?\.weight$")


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    rank: int  # `r`, the highest of the adapter's ranks when rank_pattern sets others
    lora_alpha: float
    use_rslora: bool  # scale alpha / sqrt(r) rather than alpha / r
    target_modules: tuple[str, ...]  # which of TARGET_MODULES it wraps
    base_model_name_or_path: str | None  # what PEFT recorded as its base

    @property
    def scaling(self) -> float:
        return self.lora_alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def check_adapter(adapter_dir: Path, base_model_dir: Path, max_lora_rank: int) -> AdapterInfo:
    """The adapter's facts, or ValueError naming why it cannot run on the base model (`max_lora_rank`
    0: any rank)."""
    config = _read_json(adapter_dir / CONFIG_FILE, "the adapter")
    base = _read_json(base_model_dir / "config.json", "the base model")
    _check_kind(config)
    shapes = _tensor_shapes(adapter_dir / WEIGHTS_FILE)
    targets, tensor_rank = _check_tensors(shapes, _module_shapes(base), int(base.get("num_hidden_layers", 0)))
    rank = max(_rank(config), tensor_rank)
    if max_lora_rank and rank > max_lora_rank:
        raise ValueError(f"LoRA rank {rank} is greater than max_lora_rank {max_lora_rank}")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or alpha <= 0:
        raise ValueError(f"lora_alpha must be a positive number, got {alpha!r}")
    return AdapterInfo(
        rank=rank,
        lora_alpha=float(alpha),
        use_rslora=bool(config.get("use_rslora", False)),
        target_modules=targets,
        base_model_name_or_path=config.get("base_model_name_or_path"),
    )


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"{what} has no {path.name} (looked in {path.parent})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what}'s {path.name} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what}'s {path.name} is not a JSON object")
    return data


def _check_kind(config: dict[str, Any]) -> None:
    """Only plain, unmerged LoRA on the projections: what the worker's grouped op computes."""
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"only LoRA adapters are supported, this one is {config['peft_type']}")
    for flag, what in (("use_dora", "DoRA"), ("fan_in_fan_out", "fan_in_fan_out weights")):
        if config.get(flag):
            raise ValueError(f"{what} is not supported")
    if config.get("modules_to_save"):
        raise ValueError(f"modules_to_save {config['modules_to_save']} is not supported: only LoRA weights")


def _rank(config: dict[str, Any]) -> int:
    ranks = [config.get("r", 8), *dict(config.get("rank_pattern") or {}).values()]
    if not all(isinstance(r, int) and r > 0 for r in ranks):
        raise ValueError(f"LoRA ranks must be positive integers, got {ranks}")
    return max(ranks)


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Each tensor's shape, from the safetensors header (8 bytes of length, then JSON)."""
    if not path.is_file():
        raise ValueError(f"the adapter has no {path.name} (looked in {path.parent})")
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name} is not a safetensors file (too short)")
        (size,) = struct.unpack("<Q", head)
        if size > _MAX_HEADER_BYTES:
            raise ValueError(f"{path.name} is not a safetensors file (header of {size} bytes)")
        try:
            header = json.loads(f.read(size))
        except ValueError:
            raise ValueError(f"{path.name} is not a safetensors file (unreadable header)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} is not a safetensors file")
    header.pop("__metadata__", None)
    return {name: list(entry.get("shape", [])) for name, entry in header.items() if isinstance(entry, dict)}


def _module_shapes(base: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each target in the base model, from its config."""
    try:
        hidden = int(base["hidden_size"])
        heads = int(base["num_attention_heads"])
        kv_heads = int(base.get("num_key_value_heads") or heads)
        head_dim = int(base.get("head_dim") or hidden // heads)
        intermediate = int(base["intermediate_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the base model's config.json lacks {exc} for LoRA shapes") from None
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }


def _check_tensors(
    shapes: dict[str, list[int]], modules: dict[str, tuple[int, int]], num_layers: int
) -> tuple[tuple[str, ...], int]:
    """The modules the tensors wrap and their highest rank; ValueError for one that fits no layer."""
    if not shapes:
        raise ValueError(f"{WEIGHTS_FILE} holds no tensors")
    targets: set[str] = set()
    rank = 0
    for name, shape in shapes.items():
        match = _TENSOR.search(name)
        if match is None:
            raise ValueError(
                f"tensor {name} is no LoRA weight of a supported layer ({', '.join(TARGET_MODULES)})"
            )
        layer, module, which = int(match[1]), match[2], match[3]
        if module not in modules:
            raise ValueError(f"target module {module} is not supported: only {', '.join(TARGET_MODULES)}")
        if num_layers and layer >= num_layers:
            raise ValueError(f"tensor {name} is for layer {layer}; the base model has {num_layers} layers")
        in_features, out_features = modules[module]
        # lora_A is (r, in_features), lora_B (out_features, r).
        want = in_features if which == "A" else out_features
        got = shape[1] if which == "A" and len(shape) == 2 else shape[0] if len(shape) == 2 else None
        if got != want:
            raise ValueError(
                f"tensor {name} has shape {shape}, which does not fit the base model's {module} "
                f"({in_features} -> {out_features}): the adapter was trained for another base model"
            )
        targets.add(module)
        rank = max(rank, shape[0] if which == "A" else shape[1])
    return tuple(m for m in TARGET_MODULES if m in targets), rank
