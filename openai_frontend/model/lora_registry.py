"""The LoRA adapters a deployment serves, kept in Redis so that every gateway (and batch task) sees
the same ones: one hash, adapter name -> LoadedAdapter (common/streams.py LORA_ADAPTERS).

A lookup reads through on a miss, so an adapter loaded through any gateway is served by every other
one at once; a hit is kept for CACHE_S, so an unloaded one may still be taken by another gateway for
that long (the gateway that unloads it forgets it at once). Requests already queued carry their
LoRARequest and finish either way.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import redis
import redis.asyncio as aioredis

from common.protocol import LoRARequest
from common.streams import LORA_ADAPTERS

# How long a gateway trusts an adapter it read, before it asks Redis again.
CACHE_S = 1.0


class LoadedAdapter(msgspec.Struct, frozen=True, kw_only=True):
    lora_request: LoRARequest  # what a request for it carries to the workers
    base_model_name: str  # the served base model it runs on (its `parent` in /v1/models)
    created: int  # unix seconds it was loaded


def read_adapter(r: redis.Redis, name: str) -> LoadedAdapter | None:
    """The adapter loaded under `name`, read now (a Celery task's lookup: no cache to go stale)."""
    raw: Any = r.hget(LORA_ADAPTERS, name)
    return None if raw is None else msgspec.msgpack.decode(raw, type=LoadedAdapter)


class LoRARegistry:
    def __init__(self, redis: aioredis.Redis, cache_s: float = CACHE_S) -> None:
        self._redis = redis
        self._cache_s = cache_s
        self._cache: dict[str, tuple[float, LoadedAdapter]] = {}  # name -> (read at, adapter)

    async def get(self, name: str) -> LoadedAdapter | None:
        """The adapter loaded under `name`, or None."""
        now = time.monotonic()
        cached = self._cache.get(name)
        if cached is not None and now - cached[0] < self._cache_s:
            return cached[1]
        raw: Any = await self._redis.hget(LORA_ADAPTERS, name)
        if raw is None:
            self._cache.pop(name, None)
            return None
        adapter = msgspec.msgpack.decode(raw, type=LoadedAdapter)
        self._cache[name] = (now, adapter)
        return adapter

    async def add(self, adapter: LoadedAdapter) -> bool:
        """Load it; False when an adapter of that name is loaded already (through any gateway)."""
        name = adapter.lora_request.lora_name
        added = bool(await self._redis.hsetnx(LORA_ADAPTERS, name, msgspec.msgpack.encode(adapter)))
        self._cache.pop(name, None)
        return added

    async def put(self, adapter: LoadedAdapter) -> None:
        """Load it, in place of any adapter of that name (a static adapter, at a gateway's start)."""
        name = adapter.lora_request.lora_name
        await self._redis.hset(LORA_ADAPTERS, name, msgspec.msgpack.encode(adapter))
        self._cache.pop(name, None)

    async def remove(self, name: str) -> bool:
        """Unload it; False when no adapter of that name is loaded."""
        self._cache.pop(name, None)
        return bool(await self._redis.hdel(LORA_ADAPTERS, name))

    async def listing(self) -> list[LoadedAdapter]:
        """Every loaded adapter, oldest first."""
        raw: Any = await self._redis.hgetall(LORA_ADAPTERS)
        adapters = [msgspec.msgpack.decode(value, type=LoadedAdapter) for value in raw.values()]
        return sorted(adapters, key=lambda a: (a.created, a.lora_request.lora_name))
