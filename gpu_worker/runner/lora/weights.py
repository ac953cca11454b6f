"""An adapter's factors read into host memory, checked first by common/lora/lora_adapter.py."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from safetensors.torch import load_file

from common.lora.lora_adapter import BaseModelShapes, LoRAAdapter, read_lora_adapter
from gpu_worker.runner.lora.layers import Factors


@dataclass(frozen=True, slots=True)
class LoRAWeights:
    adapter: LoRAAdapter
    layers: dict[int, dict[str, Factors]]  # layer -> module name -> its factors, in the model's dtype

    @property
    def num_bytes(self) -> int:
        return sum(
            f.lora_a.nbytes + f.lora_b.nbytes for modules in self.layers.values() for f in modules.values()
        )


def read_lora_weights(
    path: str, base: BaseModelShapes, max_lora_rank: int, dtype: torch.dtype, pin: bool
) -> LoRAWeights:
    """The adapter in directory `path`, its factors in `dtype` (pinned with `pin`, so that copies to the
    device do not block); a `LoRAAdapterError` says what is wrong with one that cannot be served."""
    adapter = read_lora_adapter(path, base, max_lora_rank)
    tensors = load_file(str(adapter.weights_file))
    layers: dict[int, dict[str, Factors]] = defaultdict(dict)
    for module in adapter.modules:
        a, b = (tensors[name].to(dtype).contiguous() for name in (module.lora_a, module.lora_b))
        if pin:
            a, b = a.pin_memory(), b.pin_memory()
        layers[module.layer][module.module] = Factors(a, b, module.scaling)
    return LoRAWeights(adapter=adapter, layers=dict(layers))
