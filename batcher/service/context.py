"""What every part of the active batcher shares: its settings, Redis, its leadership, the scheduler and
the outbox of writes sent once per iteration."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from batcher.core.scheduler import Scheduler
from batcher.service.leadership import Leadership
from batcher.service.outbox import Outbox
from batcher.settings import BatcherSettings
from common.streams import CellKeys, cell_keys


@dataclass(frozen=True, slots=True)
class BatcherContext:
    settings: BatcherSettings
    redis: redis.Redis
    leadership: Leadership
    scheduler: Scheduler
    outbox: Outbox

    @property
    def keys(self) -> CellKeys:
        """The keys of the batcher's cell (CBSERVE_CELL)."""
        return cell_keys(self.settings.cell)


class ContextPart:
    """A part of the active batcher (inbox, housekeeping) that works on the context's pieces by name."""

    def __init__(self, ctx: BatcherContext) -> None:
        self.settings = ctx.settings
        self.keys = ctx.keys
        self.redis = ctx.redis
        self.leadership = ctx.leadership
        self.scheduler = ctx.scheduler
        self.outbox = ctx.outbox
