"""Whether an adapter may be loaded, and on which base model: every refusal a 400 naming the reason.

The adapter's files are checked against its base model's config (common/lora/lora_adapter.py) under the
lowest rank limit known: GATEWAY_MAX_LORA_RANK and the max_lora_rank each worker of the base model's
cells announced (WorkerInfo in the cell's workers hash). A base model whose workers all serve no
adapters (max_loras 0) refuses them; one whose workers have not registered yet is checked against
GATEWAY_MAX_LORA_RANK alone, where one is set (at a gateway's start its workers may still be loading).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from common.lora.lora_adapter import CONFIG_FILE, check_adapter
from common.protocol import LoRARequest, WorkerInfo, decode_worker
from common.streams import cell_keys
from openai_frontend.model.lora_registry import LoadedAdapter
from openai_frontend.model.served_model import ServedModel
from openai_frontend.model.served_models import ServedModels
from openai_frontend.protocol.errors import OpenAIError, invalid_request


class AdapterRefused(OpenAIError):
    """A 400 about the adapter (vLLM answers every refusal to load with 400)."""

    def __init__(self, message: str, param: str | None = "lora_path") -> None:
        super().__init__(400, message, param=param, code="invalid_lora_adapter")


def base_model_of(
    models: ServedModels, lora_name: str, lora_path: str, base_model_name: str | None
) -> ServedModel:
    """The base model an adapter runs on: the one named, else the only one, else the one PEFT recorded
    as its base (`base_model_name_or_path`, matched to a served name or directory)."""
    if models.find(lora_name) is not None:
        raise invalid_request(
            f"The lora adapter name '{lora_name}' conflicts with a served base model.", "lora_name"
        )
    if base_model_name is not None:
        found = models.find(base_model_name)
        if found is None:
            raise invalid_request(
                f"base_model_name '{base_model_name}' is not a served model; served: "
                f"{', '.join(models.names)}",
                "base_model_name",
            )
        return found
    if len(models.models) == 1:
        return models.default
    recorded = _recorded_base(Path(lora_path))
    for served in models.models:
        if recorded and (
            recorded == served.rules.name or Path(recorded).resolve() == Path(served.root).resolve()
        ):
            return served
    raise invalid_request(
        f"this server serves several models ({', '.join(models.names)}): name the adapter's one as "
        "base_model_name",
        "base_model_name",
    )


def _recorded_base(adapter_dir: Path) -> str | None:
    try:
        value = json.loads((adapter_dir / CONFIG_FILE).read_text(encoding="utf-8")).get(
            "base_model_name_or_path"
        )
    except (OSError, ValueError, AttributeError):
        return None  # the check proper says what is wrong with the file
    return value if isinstance(value, str) else None


async def workers_of(redis: aioredis.Redis, cells: Sequence[str]) -> list[WorkerInfo]:
    """The workers registered in these cells now."""
    found: list[WorkerInfo] = []
    for cell in cells:
        raw: Any = await redis.hvals(cell_keys(cell).workers)
        found.extend(decode_worker(value) for value in raw)
    return found


def rank_limit(served: ServedModel, workers: Sequence[WorkerInfo], max_lora_rank: int, strict: bool) -> int:
    """The highest rank the base model's workers take (0: no limit known); AdapterRefused when none
    of them serves adapters, or (`strict`, a runtime load) when none has registered and
    GATEWAY_MAX_LORA_RANK says nothing."""
    name = served.rules.name
    lora_workers = [w for w in workers if w.max_loras > 0]
    if workers and not lora_workers:
        raise AdapterRefused(
            f"no worker of model '{name}' serves LoRA adapters (they announce max_loras 0): start them "
            "with adapters enabled",
            param=None,
        )
    if not workers and strict and not max_lora_rank:
        raise AdapterRefused(
            f"no worker of model '{name}' has registered yet, so their max_lora_rank is unknown: retry "
            "once they are up, or set GATEWAY_MAX_LORA_RANK",
            param=None,
        )
    limits = [r for r in (max_lora_rank, *(w.max_lora_rank for w in lora_workers)) if r > 0]
    return min(limits, default=0)


def checked_files(lora_name: str, lora_path: str, served: ServedModel, max_rank: int) -> LoadedAdapter:
    """The adapter to register, once its files fit the base model; AdapterRefused naming why not."""
    try:
        check_adapter(Path(lora_path), Path(served.root), max_rank)
    except ValueError as exc:
        raise AdapterRefused(f"Invalid LoRA adapter '{lora_name}' at {lora_path}: {exc}") from None
    return LoadedAdapter(
        lora_request=LoRARequest(lora_name=lora_name, lora_path=lora_path),
        base_model_name=served.rules.name,
        created=int(time.time()),
    )


async def checked_adapter(
    redis: aioredis.Redis,
    served: ServedModel,
    cells: Sequence[str],
    lora_name: str,
    lora_path: str,
    max_lora_rank: int,
) -> LoadedAdapter:
    """A runtime load's adapter, checked against its base model and that model's workers."""
    limit = rank_limit(served, await workers_of(redis, cells), max_lora_rank, strict=True)
    # Reading files: off the event loop (the path may be on a slow or network disk).
    return await asyncio.to_thread(checked_files, lora_name, lora_path, served, limit)
