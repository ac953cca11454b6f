"""Which cell a new request goes to, for a gateway that places requests in several (GATEWAY_CELLS).

Only live cells count: those whose batcher refreshed its stats hash within `LIVE_WITHIN_S` (a cell
whose batchers are all gone receives nothing; with none live the first cell gets the request and it
waits there for a batcher). Among them, by `GATEWAY_CELL_POLICY`:

- `cache_aware` (default): the least cost, cost = load − weight × matched / blocks, where load is the
  requests waiting and running in the cell's batcher, blocks the prompt's full blocks (of the block
  size the cell's workers announce, `WorkerInfo.block_size`, read once per cell) and matched how many
  of them lead a prompt this gateway placed in the cell (gateway/prefix_index.py).
  A cell that was sent the whole prompt is preferred unless it has `weight` more requests than
  another: affinity while loads are near, least load when they are not (SGLang's router switches
  between the two by thresholds; NVIDIA Dynamo's KV router likewise adds overlap and load).
- `least_load`: the same with weight 0 (no index kept).
- `random`: any live cell, uniformly; the baseline the others are measured against.

With discovery (GATEWAY_CELLS=*) the cells are those whose batcher scored the registry within
`LIVE_WITHIN_S`, read again at most every `REFRESH_S`: a cell started at run time is placed in from
then on, one gone stops being placed in once its score ages out.

A request's `prompt_cache_key` (OpenAI's placement hint) counts as a whole-prompt match in the cell
the last request with that key went to: a conversation whose turns differ early (a changed system
prompt, a summary) still goes where its cache is while loads are near. The last `KEY_CAPACITY` keys
are remembered, each scoped to its API key.

Ties go round-robin, so idle cells share the traffic. Each gateway keeps its own index of what it
placed, so several gateways each see part of the picture; the cells' caches evict on their own. A
cell seen dead has its index dropped: a batcher that comes back starts with an empty cache. One
round trip per cell, concurrently (each cell's hash is in its own slot); a gateway of one cell asks
nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import redis.asyncio as aioredis

from common.protocol import decode_worker
from common.redis_io.redis_conn import as_str
from common.streams import CELLS_REGISTRY, cell_keys
from gateway.prefix_index import BLOCK_TOKENS, PrefixIndex, prompt_hashes

# A batcher refreshes its stats at least every worker check (0.5 s); its healthcheck allows 10 s.
LIVE_WITHIN_S = 10.0
# How often a discovering router reads the registry of cells again.
REFRESH_S = 1.0
# prompt_cache_key -> the cell its last request went to, for this many keys (least recently used go).
KEY_CAPACITY = 100_000

CellPolicy = Literal["cache_aware", "least_load", "random"]


class CellRouter:
    def __init__(
        self,
        cells: list[str],
        policy: CellPolicy = "cache_aware",
        prefix_weight: float = 4.0,
        index_blocks: int = 100_000,
        discover: bool = False,
    ) -> None:
        self.cells = cells
        self.policy = policy
        self.prefix_weight = prefix_weight if policy == "cache_aware" else 0.0
        self._index_blocks = index_blocks
        self.indexes = {cell: PrefixIndex(index_blocks) for cell in cells}
        # Tokens per KV block of each cell, as its workers announce it; BLOCK_TOKENS until known.
        self.block_tokens: dict[str, int] = {}
        self._home = cells[0]  # with discovery: always a candidate, as without any live cell
        self._discover = discover
        self._refreshed_at = float("-inf")
        self._turn = itertools.count()  # round-robin among equally costly cells
        self._random = random.Random()
        self._key_cells: OrderedDict[str, str] = OrderedDict()  # prompt_cache_key -> its last cell

    async def place(
        self,
        redis: aioredis.Redis,
        prompt_token_ids: Sequence[int] = (),
        cache_key: str = "",
        extra_keys: bytes = b"",
    ) -> str:
        """The cell for the next request, whose (first) prompt is `prompt_token_ids`, whose
        `prompt_cache_key` (scoped to its API key) is `cache_key` and whose blocks' KV also depends on
        `extra_keys` (its LoRA adapter's `cache_key`)."""
        await self.refresh(redis)
        if len(self.cells) == 1:
            return self.cells[0]
        loads = await asyncio.gather(*(self._load(redis, cell) for cell in self.cells))
        if self.prefix_weight:
            unknown = [
                c
                for c, load in zip(self.cells, loads, strict=True)
                if load is not None and c not in self.block_tokens
            ]
            await asyncio.gather(*(self._learn_block_tokens(redis, cell) for cell in unknown))
        return self.choose(dict(zip(self.cells, loads, strict=True)), prompt_token_ids, cache_key, extra_keys)

    async def _learn_block_tokens(self, redis: aioredis.Redis, cell: str) -> None:
        """The block size one of the cell's workers announced (all of a cell's workers share one)."""
        workers: Any = await redis.hvals(cell_keys(cell).workers)
        if workers:
            self.block_tokens[cell] = decode_worker(workers[0]).block_size

    async def refresh(self, redis: aioredis.Redis) -> None:
        """With discovery, the cells registered lately (read at most every REFRESH_S)."""
        now = time.monotonic()
        if not self._discover or now - self._refreshed_at < REFRESH_S:
            return
        self._refreshed_at = now
        since = time.time() - LIVE_WITHIN_S
        found: Any = await redis.zrangebyscore(CELLS_REGISTRY, since, "+inf")
        self.cells = [self._home, *sorted({as_str(c) for c in found} - {self._home})]
        # A cell no longer registered is forgotten with its index, as one seen dead is.
        self.indexes = {c: self.indexes.get(c) or PrefixIndex(self._index_blocks) for c in self.cells}

    def choose(
        self,
        loads: dict[str, float | None],
        prompt_token_ids: Sequence[int],
        cache_key: str = "",
        extra_keys: bytes = b"",
    ) -> str:
        """The cell for a prompt given each cell's load (None: not live); records the placement."""
        live = {cell: load for cell, load in loads.items() if load is not None}
        for cell in loads.keys() - live.keys():
            self.indexes[cell].clear()
            self.block_tokens.pop(cell, None)  # its workers may come back with another block size
        if not live:
            return self.cells[0]
        if self.policy == "random":
            return self._random.choice(list(live))
        hashes = self._hashes(prompt_token_ids, live, extra_keys)
        costs = {cell: load - self._affinity(cell, hashes[cell]) for cell, load in live.items()}
        keyed = self._key_cells.get(cache_key) if cache_key and self.prefix_weight else None
        if keyed in costs:
            # Its cache is there: as if the whole prompt matched (the better of the two affinities).
            costs[keyed] = min(costs[keyed], live[keyed] - self.prefix_weight)
        least = min(costs.values())
        tied = [cell for cell, cost in costs.items() if cost == least]
        cell = tied[next(self._turn) % len(tied)]
        self.indexes[cell].add(hashes[cell])
        if cache_key and self.prefix_weight:
            self._key_cells[cache_key] = cell
            self._key_cells.move_to_end(cache_key)
            if len(self._key_cells) > KEY_CAPACITY:
                self._key_cells.popitem(last=False)
        return cell

    def _hashes(
        self, prompt_token_ids: Sequence[int], cells: Iterable[str], extra_keys: bytes
    ) -> dict[str, list[bytes]]:
        """The prompt's block hashes in each cell's block size (computed once per size)."""
        by_size: dict[int, list[bytes]] = {}
        hashes = {}
        for cell in cells:
            size = self.block_tokens.get(cell, BLOCK_TOKENS)
            if self.prefix_weight and size not in by_size:
                by_size[size] = prompt_hashes(prompt_token_ids, size, extra_keys)
            hashes[cell] = by_size.get(size, [])
        return hashes

    def _affinity(self, cell: str, hashes: list[bytes]) -> float:
        """The cost a cell is spared for the share of the prompt it was likely sent before."""
        return self.prefix_weight * self.indexes[cell].matched(hashes) / len(hashes) if hashes else 0.0

    @staticmethod
    async def _load(redis: aioredis.Redis, cell: str) -> float | None:
        """Waiting + running requests of the cell; None when its batcher is not alive."""
        raw: Any = await redis.hmget(cell_keys(cell).stats, ["num_waiting", "num_running", "updated_at"])
        waiting, running, updated_at = raw
        if updated_at is None or time.time() - float(updated_at) > LIVE_WITHIN_S:
            return None
        return float(waiting or 0) + float(running or 0)
