"""The adapters of GATEWAY_LORA_MODULES (vLLM's --lora-modules): checked when the app is built, so a
bad one stops the gateway before it serves anything, and registered in Redis once it answers.

Every gateway of a deployment registers the same ones (the same settings), each in place of what it
finds under that name; a static adapter unloaded at run time comes back when a gateway restarts, as
vLLM's do. Their rank is checked against GATEWAY_MAX_LORA_RANK only: the workers may not have
registered yet (they refuse an adapter above their own max_lora_rank themselves).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.exceptions

from common.lora.lora_modules import parse_lora_modules, split_lora_modules
from common.redis_io.retry import Backoff
from gateway.lora.adapter_check import base_model_of, checked_files
from gateway.settings import GatewaySettings
from openai_frontend.model.lora_registry import LoadedAdapter, LoRARegistry
from openai_frontend.model.served_models import ServedModels
from openai_frontend.protocol.errors import OpenAIError

logger = logging.getLogger(__name__)


class StaticAdapters:
    def __init__(self, adapters: list[LoadedAdapter]) -> None:
        self.adapters = adapters
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_settings(cls, settings: GatewaySettings, models: ServedModels) -> StaticAdapters:
        """Each module checked against its base model; ValueError naming the first that fails."""
        adapters = []
        for module in parse_lora_modules(split_lora_modules(settings.lora_modules)):
            try:
                base = base_model_of(models, module.name, module.path, module.base_model_name)
                adapters.append(checked_files(module.name, module.path, base, settings.max_lora_rank))
            except OpenAIError as exc:
                raise ValueError(f"GATEWAY_LORA_MODULES: {exc.message}") from None
        return cls(adapters)

    def start(self, registry: LoRARegistry) -> None:
        """Register them in the background, retrying while Redis does not answer."""
        if self.adapters:
            self._task = asyncio.get_running_loop().create_task(self._register(registry))

    async def _register(self, registry: LoRARegistry) -> None:
        backoff = Backoff()
        while True:
            try:
                for adapter in self.adapters:
                    await registry.put(adapter)
            except redis.exceptions.RedisError as exc:
                logger.warning("static LoRA adapters not registered yet (%s); retrying", exc)
                await asyncio.sleep(backoff.next_delay())
                continue
            names = ", ".join(a.lora_request.lora_name for a in self.adapters)
            logger.info("static LoRA adapters registered: %s", names)
            return

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
