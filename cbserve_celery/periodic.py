"""A Celery worker's background chore: `tick()` every `interval_s` in a daemon thread.

A tick that Redis fails is logged once, until one succeeds again: the next tick is the retry, and the
worker's consumer reconnects on its own. Any other error is logged and the thread goes on, so one
bad tick does not end the chore for the worker's life.
"""

from __future__ import annotations

import logging
import threading

from cbserve_celery.redis_waits import REDIS_FAILED

logger = logging.getLogger(__name__)


class Periodic:
    def __init__(self, name: str, interval_s: float) -> None:
        self.name = name
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def tick(self) -> object:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self._interval_s):
            try:
                self.tick()
                if failing:
                    logger.info("%s: Redis answers again", self.name)
                failing = False
            except REDIS_FAILED as exc:
                if not failing:
                    logger.warning("%s: Redis failed it: %s", self.name, exc)
                failing = True
            except Exception:
                logger.exception("%s: a tick failed", self.name)
