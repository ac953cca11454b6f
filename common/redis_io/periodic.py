"""A background chore: `tick()` every `interval_s` in a daemon thread (a GPU worker's heartbeat, a
Celery worker's delivery heartbeat and batch reaper).

A tick that Redis fails is logged once, until one succeeds again: the next tick is the retry, and the
caller's clients reconnect on their own. Any other error is logged and the thread goes on, so one
bad tick does not end the chore for the process's life. A chore ends itself with `end()`.
"""

from __future__ import annotations

import logging
import threading

import redis

logger = logging.getLogger(__name__)


class Periodic:
    def __init__(
        self,
        name: str,
        interval_s: float,
        redis_failures: tuple[type[Exception], ...] = (redis.RedisError,),
    ) -> None:
        self.name = name
        self._interval_s = interval_s
        # What counts as Redis failing a tick (a Celery worker adds kombu's wrapping of it).
        self._redis_failures = redis_failures
        self._stop = threading.Event()
        # Daemon: a wedged Redis call must never keep a stopping process alive.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def tick(self) -> object:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def end(self) -> None:
        """No tick after this one (from within a tick, or from any thread)."""
        self._stop.set()

    def stop(self) -> None:
        self.end()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self._interval_s):
            try:
                self.tick()
                if failing:
                    logger.info("%s: Redis answers again", self.name)
                failing = False
            except self._redis_failures as exc:
                if not failing:  # the first failure of a run, not one line per tick
                    logger.warning("%s: Redis failed it: %s", self.name, exc)
                failing = True
            except Exception:
                logger.exception("%s: a tick failed", self.name)
