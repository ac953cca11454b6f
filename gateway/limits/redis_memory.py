"""How full the Redis holding a cell is: `used_memory` against `maxmemory`, from `INFO memory`.

Admission keeps headroom: new work is refused while less than a share of `maxmemory` is free, so the
requests already running can still write their tokens (a full Redis under `noeviction` refuses them,
and they stall). A Redis without `maxmemory` (0) has no limit Redis knows of: never judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from common.streams import cell_keys


@dataclass(frozen=True, slots=True)
class MemoryUse:
    used_bytes: int
    max_bytes: int  # 0: no maxmemory

    def over(self, headroom: float, extra_bytes: int = 0) -> bool:
        """Whether `extra_bytes` more would leave less than `headroom` (a share) of maxmemory free."""
        if self.max_bytes <= 0:
            return False
        return self.used_bytes + extra_bytes > self.max_bytes * (1.0 - headroom)

    def describe(self) -> str:
        share = 100.0 * self.used_bytes / self.max_bytes if self.max_bytes else 0.0
        return f"redis holds {self.used_bytes / 2**20:.1f} MiB, {share:.0f}% of its maxmemory"


async def memory_use(redis: aioredis.Redis, cell: str) -> MemoryUse:
    """The memory of the Redis node holding `cell`'s keys (on a cluster, the master of its slot)."""
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(cell_keys(cell).requests)
        info: Any = await redis.info("memory", target_nodes=node)
    else:
        info = await redis.info("memory")
    return MemoryUse(int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)))
