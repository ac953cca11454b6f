"""A PEFT LoRA adapter read and checked against its base model, without torch: the gateway checks one
when it is loaded (`check_adapter`: a clear 400), the worker before it reads the weights
(`read_lora_adapter`: the request fails alone).

The layout is PEFT's `save_pretrained`: `adapter_config.json` and `adapter_model.safetensors` (never
the pickled `adapter_model.bin`), tensors named `base_model.model.model.layers.{i}.{self_attn|mlp}.
{module}.lora_A.weight` [r, in] and `...lora_B.weight` [out, r]. What is served is plain LoRA on the
decoder's linears (q/k/v/o, gate/up/down): `y += scaling * (x A^T) B^T`, scaling `lora_alpha / r`, or
`lora_alpha / sqrt(r)` with rsLoRA, per module with PEFT's `rank_pattern` / `alpha_pattern`. Anything
that would compute something else (DoRA, a LoRA bias, trained embeddings or heads, ...) is refused by
name: every refusal is a `LoRAAdapterError` (a ValueError) saying what is wrong.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from common.lora.safetensors_header import SafetensorsError, TensorInfo, read_header

CONFIG_FILE: Final = "adapter_config.json"
WEIGHTS_FILE: Final = "adapter_model.safetensors"
# The decoder linears an adapter may target (vLLM's names for the Llama family), in the layer's order.
ATTENTION_MODULES: Final = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES: Final = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES: Final = (*ATTENTION_MODULES, *MLP_MODULES)
WEIGHT_DTYPES: Final = frozenset({"F32", "F16", "BF16"})
# PEFT options that change what the adapter computes, refused when set (DoRA's magnitudes, a bias on
# B, trained embeddings or heads, replicated layers, routing or sampling between factors, ...).
UNSUPPORTED_OPTIONS: Final = {
    "use_dora": "DoRA",
    "lora_bias": "a bias on lora_B",
    "modules_to_save": "fully trained modules",
    "trainable_token_indices": "trained token embeddings",
    "target_parameters": "LoRA on parameters",
    "layer_replication": "replicated layers",
    "alora_invocation_tokens": "activated LoRA",
    "use_qalora": "QALoRA",
    "use_bdlora": "block-diagonal LoRA",
    "arrow_config": "Arrow routing",
    "kasa_config": "KaSA",
    "monteclora_config": "MonteCLoRA",
    "megatron_config": "Megatron layers",
}
_TENSOR = re.compile(
    r"(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight"
)


class LoRAAdapterError(ValueError):
    """An adapter that cannot be served; the message names the adapter and what is wrong."""


@dataclass(frozen=True, slots=True)
class BaseModelShapes:
    """The sizes of a Llama-family base model's decoder linears, from its config.json."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> BaseModelShapes:
        """From a config.json's fields (a multimodal model's `text_config`); refused naming a missing one."""
        text = config.get("text_config") or config
        try:
            heads = int(text["num_attention_heads"])
            hidden = int(text["hidden_size"])
            return cls(
                hidden_size=hidden,
                intermediate_size=int(text["intermediate_size"]),
                num_attention_heads=heads,
                num_key_value_heads=int(text.get("num_key_value_heads") or heads),
                head_dim=int(text.get("head_dim") or hidden // heads),
                num_hidden_layers=int(text["num_hidden_layers"]),
            )
        except KeyError as exc:
            raise LoRAAdapterError(f"the base model's config has no {exc.args[0]!r}: LoRA needs it") from None

    @classmethod
    def read(cls, model_dir: str | Path) -> BaseModelShapes:
        """From `model_dir`/config.json."""
        path = Path(model_dir) / "config.json"
        try:
            return cls.from_config(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise LoRAAdapterError(f"cannot read the base model's config {path}: {exc}") from None

    def features(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of one of TARGET_MODULES."""
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return {
            "q_proj": (self.hidden_size, q),
            "k_proj": (self.hidden_size, kv),
            "v_proj": (self.hidden_size, kv),
            "o_proj": (q, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }[module]


@dataclass(frozen=True, slots=True)
class LoRAModule:
    """One adapted linear: its factors' tensor names in the weights file, rank and scaling."""

    layer: int
    module: str  # one of TARGET_MODULES
    rank: int
    scaling: float  # lora_alpha / rank, or lora_alpha / sqrt(rank) with rsLoRA
    lora_a: str  # [rank, in_features]
    lora_b: str  # [out_features, rank]


@dataclass(frozen=True, slots=True)
class LoRAAdapter:
    path: Path
    weights_file: Path
    rank: int  # the largest of its modules' ranks
    base_model_name_or_path: str | None  # what it was trained on, as PEFT recorded it
    modules: tuple[LoRAModule, ...]  # by layer, then in TARGET_MODULES order

    @property
    def target_modules(self) -> frozenset[str]:
        return frozenset(m.module for m in self.modules)


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """What the gateway keeps of an adapter it checked (`check_adapter`)."""

    rank: int  # the highest of its modules' ranks
    lora_alpha: float
    use_rslora: bool  # scaling alpha / sqrt(r) rather than alpha / r
    target_modules: tuple[str, ...]  # which of TARGET_MODULES it adapts, in that order
    base_model_name_or_path: str | None  # what PEFT recorded as its base

    @property
    def scaling(self) -> float:
        return self.lora_alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def check_adapter(adapter_dir: Path, base_model_dir: Path, max_lora_rank: int) -> AdapterInfo:
    """The adapter in `adapter_dir` checked against the base model in `base_model_dir` (its
    config.json) and `max_lora_rank` (0: any rank); LoRAAdapterError (a ValueError) says why not."""
    adapter = read_lora_adapter(adapter_dir, BaseModelShapes.read(base_model_dir), max_lora_rank)
    config = json.loads((adapter.path / CONFIG_FILE).read_text())
    return AdapterInfo(
        rank=adapter.rank,
        lora_alpha=float(config["lora_alpha"]),
        use_rslora=bool(config.get("use_rslora", False)),
        target_modules=tuple(m for m in TARGET_MODULES if m in adapter.target_modules),
        base_model_name_or_path=adapter.base_model_name_or_path,
    )


def read_lora_adapter(path: str | Path, base: BaseModelShapes, max_lora_rank: int) -> LoRAAdapter:
    """The adapter in directory `path`, checked against `base` and `max_lora_rank` (0: any rank);
    LoRAAdapterError says what is wrong with one that cannot be served."""
    directory = Path(path)
    config = _read_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        pickled = " (only safetensors are read, never the pickled adapter_model.bin)"
        found = pickled if (directory / "adapter_model.bin").exists() else ""
        raise LoRAAdapterError(f"adapter {directory} has no {WEIGHTS_FILE}{found}")
    try:
        tensors = read_header(weights)
    except SafetensorsError as exc:
        raise LoRAAdapterError(f"adapter {directory}: {exc}") from None
    modules = _Reader(f"adapter {directory}", config, tensors, base, max_lora_rank).modules()
    base_name = config.get("base_model_name_or_path")
    return LoRAAdapter(
        path=directory,
        weights_file=weights,
        rank=max(m.rank for m in modules),
        base_model_name_or_path=base_name if isinstance(base_name, str) else None,
        modules=modules,
    )


def _read_config(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise LoRAAdapterError(f"adapter {directory}: no such directory")
    path = directory / CONFIG_FILE
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise LoRAAdapterError(
            f"adapter {directory} has no {CONFIG_FILE} (not a PEFT adapter directory)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoRAAdapterError(f"adapter {directory}: cannot read {CONFIG_FILE}: {exc}") from None
    if not isinstance(config, dict):
        raise LoRAAdapterError(f"adapter {directory}: {CONFIG_FILE} is not a JSON object")
    _check_options(directory, config)
    return config


def _check_options(directory: Path, config: Mapping[str, Any]) -> None:
    where = f"adapter {directory}"
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise LoRAAdapterError(f"{where}: only LoRA adapters are supported, this one is {peft_type}")
    if config.get("bias", "none") != "none":
        raise LoRAAdapterError(
            f"{where}: bias {config['bias']!r} trains the base model's biases; only 'none'"
        )
    if config.get("fan_in_fan_out"):
        raise LoRAAdapterError(f"{where}: fan_in_fan_out is for Conv1D layers (GPT-2), not these linears")
    for option, what in UNSUPPORTED_OPTIONS.items():
        if config.get(option):
            raise LoRAAdapterError(f"{where}: {what} is not supported ({option} {config[option]!r})")
    for name in ("r", "lora_alpha"):
        value = config.get(name)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise LoRAAdapterError(f"{where}: {name} must be a positive number, not {value!r}")
    targets = config.get("target_modules")
    if isinstance(targets, list):
        unsupported = [t for t in targets if str(t).rsplit(".", 1)[-1] not in TARGET_MODULES]
        if unsupported:
            raise LoRAAdapterError(
                f"{where}: unsupported target module {unsupported[0]!r}: "
                f"only {', '.join(TARGET_MODULES)} are served"
            )
    elif targets is not None and not isinstance(targets, str):
        raise LoRAAdapterError(f"{where}: target_modules must be a list or a regular expression")


def _pattern_value(patterns: Mapping[str, Any], module_name: str, default: Any) -> Any:
    """PEFT's rank_pattern / alpha_pattern lookup: the first key matching the module name's end."""
    for pattern, value in patterns.items():
        try:
            if re.match(rf"(.*\.)?({pattern})$", module_name):
                return value
        except re.error as exc:
            raise LoRAAdapterError(f"the pattern {pattern!r} is not a regular expression: {exc}") from None
    return default


@dataclass(frozen=True, slots=True)
class _Reader:
    """One adapter's factors checked against the base model: the state each check reads."""

    where: str  # "adapter <path>", how every refusal starts
    config: Mapping[str, Any]
    tensors: Mapping[str, TensorInfo]
    base: BaseModelShapes
    max_lora_rank: int

    def modules(self) -> tuple[LoRAModule, ...]:
        factors = self._factors()
        layers = self.config.get("layers_to_transform")
        allowed = {layers} if isinstance(layers, int) else set(layers) if isinstance(layers, list) else None
        modules = []
        for (layer, module), pair in sorted(factors.items(), key=lambda kv: (kv[0][0], _order(kv[0][1]))):
            label = f"layers.{layer}.{module}"
            if layer >= self.base.num_hidden_layers:
                raise LoRAAdapterError(
                    f"{self.where}: {label} is past the base model's {self.base.num_hidden_layers} layers: "
                    "the adapter was trained for another base model"
                )
            if allowed is not None and layer not in allowed:
                raise LoRAAdapterError(
                    f"{self.where}: {label} is outside layers_to_transform {sorted(allowed)}"
                )
            if "A" not in pair or "B" not in pair:
                missing = "lora_A" if "A" not in pair else "lora_B"
                raise LoRAAdapterError(f"{self.where}: {label} has no {missing} tensor")
            modules.append(self._module(layer, module, pair))
        return tuple(modules)

    def _factors(self) -> dict[tuple[int, str], dict[str, str]]:
        """(layer, module) -> {"A": tensor name, "B": tensor name}, each tensor's name and dtype checked."""
        where = self.where
        factors: dict[tuple[int, str], dict[str, str]] = {}
        for name, info in self.tensors.items():
            match = _TENSOR.fullmatch(name)
            if match is None:
                raise LoRAAdapterError(
                    f"{where}: unsupported tensor {name!r}: only LoRA factors of "
                    f"{', '.join(TARGET_MODULES)} are served"
                )
            layer, block, module, factor = int(match[1]), match[2], match[3], match[4]
            if module not in TARGET_MODULES or (block == "mlp") != (module in MLP_MODULES):
                raise LoRAAdapterError(
                    f"{where}: unsupported target module {block}.{module}: "
                    f"only {', '.join(TARGET_MODULES)} are served"
                )
            if info.dtype not in WEIGHT_DTYPES:
                raise LoRAAdapterError(f"{where}: tensor {name!r} is {info.dtype}, not F32, F16 or BF16")
            if factor in factors.setdefault((layer, module), {}):
                raise LoRAAdapterError(f"{where}: two lora_{factor} tensors for layers.{layer}.{module}")
            factors[(layer, module)][factor] = name
        if not factors:
            raise LoRAAdapterError(f"{where}: {WEIGHTS_FILE} holds no LoRA factors")
        return factors

    def _module(self, layer: int, module: str, pair: Mapping[str, str]) -> LoRAModule:
        where, label = self.where, f"layers.{layer}.{module}"
        a, b = self.tensors[pair["A"]].shape, self.tensors[pair["B"]].shape
        in_features, out_features = self.base.features(module)
        if len(a) != 2 or len(b) != 2 or a[1] != in_features or b[0] != out_features or a[0] != b[1]:
            raise LoRAAdapterError(
                f"{where}: {label} has lora_A {list(a)} and lora_B {list(b)}, but the base model's "
                f"{module} takes {in_features} features to {out_features}: it needs [r, {in_features}] and "
                f"[{out_features}, r]: the adapter was trained for another base model"
            )
        rank = a[0]
        block = "mlp" if module in MLP_MODULES else "self_attn"
        module_name = f"model.layers.{layer}.{block}.{module}"
        config = self.config
        configured = int(_pattern_value(config.get("rank_pattern") or {}, module_name, config["r"]))
        if rank != configured:
            raise LoRAAdapterError(f"{where}: {label} has rank {rank} but its config says r={configured}")
        if rank < 1:
            raise LoRAAdapterError(f"{where}: {label} has rank 0")
        if self.max_lora_rank and rank > self.max_lora_rank:
            raise LoRAAdapterError(
                f"{where}: LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank} ({label}): "
                "serve it with a larger max_lora_rank"
            )
        alpha = float(_pattern_value(config.get("alpha_pattern") or {}, module_name, config["lora_alpha"]))
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        return LoRAModule(
            layer=layer, module=module, rank=rank, scaling=scaling, lora_a=pair["A"], lora_b=pair["B"]
        )


def _order(module: str) -> int:
    return TARGET_MODULES.index(module)
