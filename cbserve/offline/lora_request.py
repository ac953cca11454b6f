"""vLLM's `LoRARequest(lora_name, lora_int_id, lora_path)` for `LLM.generate`, and the adapters a call
names checked before any request is queued (a bad one raises, naming what is wrong)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import protocol
from common.lora.lora_adapter import BaseModelShapes, read_lora_adapter


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """vLLM's (vllm/lora/request.py): `lora_int_id` is vLLM's handle for the adapter; here the name and
    path tell adapters apart, so it is only checked to be positive, as vLLM does."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be > 0, got {self.lora_int_id}")
        if not self.lora_path:
            raise ValueError("lora_path is required: the adapter's directory")


AnyLoRARequest = LoRARequest | protocol.LoRARequest
LoRARequests = AnyLoRARequest | Sequence[AnyLoRARequest | None] | None


def on_the_wire(lora: AnyLoRARequest) -> protocol.LoRARequest:
    if isinstance(lora, protocol.LoRARequest):
        return lora
    return protocol.LoRARequest(lora_name=lora.lora_name, lora_path=lora.lora_path)


def per_prompt(lora_request: LoRARequests, num_prompts: int) -> list[protocol.LoRARequest | None]:
    """One adapter (or None) per prompt: one for all, or a list of one per prompt (vLLM's rule)."""
    if lora_request is None or isinstance(lora_request, LoRARequest | protocol.LoRARequest):
        one = None if lora_request is None else on_the_wire(lora_request)
        return [one] * num_prompts
    if len(lora_request) != num_prompts:
        raise ValueError(
            f"{len(lora_request)} lora_requests for {num_prompts} prompts: give one, or one per prompt"
        )
    return [None if lora is None else on_the_wire(lora) for lora in lora_request]


def check_adapters(
    loras: Sequence[protocol.LoRARequest | None], model_dir: Path, enabled: bool, max_lora_rank: int
) -> None:
    """Each adapter named, read and checked against the base model (common/lora/lora_adapter.py)."""
    named = {lora.cache_key: lora for lora in loras if lora is not None}
    if named and not enabled:
        raise ValueError("a LoRA adapter was given but the LLM was made without enable_lora=True")
    base = BaseModelShapes.read(model_dir) if named else None
    for lora in named.values():
        assert base is not None
        read_lora_adapter(lora.lora_path, base, max_lora_rank)
