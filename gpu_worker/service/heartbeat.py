"""The worker's pulse: a thread, so that a long forward pass never makes the worker look dead."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import redis

from common.redis_io.periodic import Periodic
from common.streams import CellKeys
from gpu_worker.service.fenced_writes import FencedWrites

logger = logging.getLogger(__name__)


class Heartbeat(Periodic):
    def __init__(
        self,
        client: redis.Redis,
        worker_id: str,
        interval_s: float,
        keys: CellKeys,
        health_file: str | None = None,
    ) -> None:
        super().__init__("heartbeat", interval_s)
        self._client = client
        self._fenced_writes = FencedWrites(client, keys)
        # Touched after each beat that reached Redis: a container healthcheck reads its age.
        self._health_file = Path(health_file) if health_file else None
        self._worker_id = worker_id
        # Set when a beat finds this worker fenced: the batcher declared it dead (it was paused too
        # long); the worker loop then rejoins under a new id. The thread stops beating for good.
        self.fenced = threading.Event()

    def beat(self) -> bool:
        """One fenced beat now; False (and `fenced` set) when the batcher has declared this worker dead."""
        if self._fenced_writes.beat(self._client, self._worker_id):
            return True
        self.fenced.set()
        return False

    def tick(self) -> None:
        if not self.beat():
            logger.warning("heartbeat refused: worker %s was declared dead", self._worker_id)
            self.end()
        elif self._health_file is not None:
            self._health_file.touch()
