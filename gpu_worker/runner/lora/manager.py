"""Which adapters a worker holds: up to `max_cpu_loras` in host memory, least recently used dropped
first, and the `max_loras` device slots a step's adapters are copied into (vLLM's LRU caches of
`max_cpu_loras` and `max_loras`).

An adapter is read (and checked) when a request for it arrives, so a bad one fails that request alone
with the reason; the batcher sends steps of at most `max_loras` adapters, and a step's adapters are
copied into slots no adapter of that step uses, the least recently used first. Adapters are told
apart by `LoRARequest.cache_key` (name and path): one reloaded from another path is another adapter.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import torch

from common.lora.lora_adapter import BaseModelShapes, LoRAAdapterError
from common.protocol import LoRARequest
from gpu_worker.runner.input_batch import ScheduledRequest
from gpu_worker.runner.lora.layers import LoRALayer
from gpu_worker.runner.lora.weights import LoRAWeights, read_lora_weights

logger = logging.getLogger(__name__)


class LoRAManager:
    def __init__(
        self,
        layers: Sequence[LoRALayer],
        base: BaseModelShapes,
        *,
        max_loras: int,
        max_lora_rank: int,
        max_cpu_loras: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.layers = layers
        self.base = base
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.dtype = dtype
        self._pin = device.type == "cuda"
        self._host: OrderedDict[bytes, LoRAWeights] = OrderedDict()  # least recently used first
        self._slots: OrderedDict[bytes, int] = OrderedDict()  # adapter -> its slot, least recently used first
        self.num_reads = 0  # adapters read from disk (tests)
        self.num_slot_loads = 0  # adapters copied into a slot (tests)

    def add(self, lora: LoRARequest) -> str | None:
        """Have `lora` in host memory for a request that names it; why not, when it cannot be served."""
        try:
            self._weights(lora)
        except LoRAAdapterError as exc:
            return f"LoRA adapter {lora.lora_name!r} cannot be served: {exc}"
        except Exception as exc:  # a weights file the header check passed but safetensors cannot read
            logger.exception("reading LoRA adapter %s failed", lora.lora_path)
            return f"LoRA adapter {lora.lora_name!r} cannot be read: {type(exc).__name__}: {exc}"
        return None

    def slots_for(self, loras: Iterable[LoRARequest]) -> dict[bytes, int]:
        """The slot of each of a step's adapters (by cache key), copying in those not in one yet."""
        wanted = {lora.cache_key: lora for lora in loras}
        if len(wanted) > self.max_loras:
            raise ValueError(
                f"a step uses {len(wanted)} LoRA adapters but this worker has {self.max_loras} slots"
            )
        for key in wanted:
            if key in self._slots:
                self._slots.move_to_end(key)
        for key, lora in wanted.items():
            if key not in self._slots:
                self._load(self._free_slot(wanted), key, lora)
        return {key: self._slots[key] for key in wanted}

    def step_slots(self, scheduled: Sequence[ScheduledRequest]) -> dict[str, int]:
        """The slot of each scheduled request that runs an adapter, the step's adapters copied into
        the decoder's slots first."""
        loras = [r.state.lora_request for r in scheduled if r.state.lora_request is not None]
        slots = self.slots_for(loras)
        return {
            r.state.req_id: slots[r.state.lora_request.cache_key]
            for r in scheduled
            if r.state.lora_request is not None
        }

    def _free_slot(self, wanted: dict[bytes, LoRARequest]) -> int:
        """A slot nobody holds, or that of the least recently used adapter this step does not use."""
        taken = set(self._slots.values())
        free = [slot for slot in range(self.max_loras) if slot not in taken]
        if free:
            return free[0]
        victim = next(key for key in self._slots if key not in wanted)
        return self._slots.pop(victim)

    def _load(self, slot: int, key: bytes, lora: LoRARequest) -> None:
        weights = self._weights(lora)
        for i, layer in enumerate(self.layers):
            layer.load(slot, weights.layers.get(i, {}))
        self._slots[key] = slot
        self.num_slot_loads += 1

    def _weights(self, lora: LoRARequest) -> LoRAWeights:
        key = lora.cache_key
        weights = self._host.get(key)
        if weights is not None:
            self._host.move_to_end(key)
            return weights
        weights = read_lora_weights(lora.lora_path, self.base, self.max_lora_rank, self.dtype, self._pin)
        self.num_reads += 1
        logger.info(
            "read LoRA adapter %r (rank %d, %s) from %s: %.1f MiB",
            lora.lora_name,
            weights.adapter.rank,
            ", ".join(sorted(weights.adapter.target_modules)),
            lora.lora_path,
            weights.num_bytes / 2**20,
        )
        self._host[key] = weights
        while len(self._host) > self.max_cpu_loras:
            self._host.popitem(last=False)
        return weights
