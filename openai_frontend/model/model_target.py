"""What a request's `model` names: a base model, or a LoRA adapter on one.

Base models are looked up first, so a base model's name always means the base model (an adapter may
not take one: openai_frontend/model/lora_registry.py refuses it at load); an adapter is read from Redis.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.protocol import LoRARequest
from openai_frontend.model.lora_registry import LoRARegistry
from openai_frontend.model.served_model import ServedModel
from openai_frontend.model.served_models import ServedModels


@dataclass(frozen=True, slots=True)
class ModelTarget:
    served: ServedModel  # the base model: its tokenizer, template, rules and cells
    lora_request: LoRARequest | None = None  # the adapter it runs with; None: the base model

    @property
    def name(self) -> str:
        """The name the answer shows as its `model`."""
        return self.served.rules.name if self.lora_request is None else self.lora_request.lora_name


async def resolve_model(
    models: ServedModels, adapters: LoRARegistry | None, requested: str | None
) -> ModelTarget:
    """The target `requested` names; raises the 404 naming the served models when it names none."""
    served = models.find(requested)
    if served is not None:
        return ModelTarget(served)
    adapter = await adapters.get(requested) if adapters is not None and requested else None
    base = models.find(adapter.base_model_name) if adapter is not None else None
    if adapter is None or base is None:
        raise models.not_found(requested or "")
    return ModelTarget(base, adapter.lora_request)
