"""Every base model one deployment serves, by the names a request may give it.

The gateway builds it once from its settings (one model, or GATEWAY_MODELS_CONFIG's several); a batch
task builds it from the batch's rules and its own tokenizers. The first model is the one a request
without `model` gets, as vLLM's first served name is. LoRA adapters are not here: they come and go at
run time and live in Redis (openai_frontend/model/lora_registry.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from openai_frontend.model.path_names import as_path_name
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.errors import OpenAIError


class ServedModels:
    def __init__(self, models: Sequence[ServedModel]) -> None:
        if not models:
            raise ValueError("a deployment serves at least one model")
        self.models = tuple(models)
        self._by_name = {m.rules.name: m for m in models}

    @property
    def default(self) -> ServedModel:
        """The model a request without `model` gets: the first one configured."""
        return self.models[0]

    @property
    def names(self) -> list[str]:
        return [m.rules.name for m in self.models]

    def find(self, requested: str | None) -> ServedModel | None:
        """The model `requested` names (its served name, or its directory's path where the server
        accepts it); the default one for None; None when no base model has that name."""
        if requested is None:
            return self.default
        found = self._by_name.get(requested)
        if found is not None:
            return found
        path = as_path_name(requested)
        return next((m for m in self.models if path in m.rules.path_names), None)

    def get(self, requested: str | None) -> ServedModel:
        """As `find`, or the 404 OpenAI and vLLM answer for a model that does not exist."""
        found = self.find(requested)
        if found is None:
            raise self.not_found(requested or "")
        return found

    def not_found(self, requested: str) -> OpenAIError:
        """vLLM's 404 ("The model `x` does not exist."), naming the models that do."""
        served = ", ".join(f"`{name}`" for name in self.names)
        return OpenAIError(
            404,
            f"The model `{requested}` does not exist; this server serves {served}.",
            param="model",
            code="model_not_found",
        )
