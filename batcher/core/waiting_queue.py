"""The batcher's shared waiting queue, in (priority, arrival) order. No I/O.

One FIFO per priority level (lower runs first: interactive requests are 0, batch lines 1). New
requests join the back of their level; preempted, orphaned and retried ones go back to the front of
theirs, as they did in the single FIFO this replaces, so with one priority level nothing changes.
A waiting interactive request therefore always comes before every waiting batch line, including a
batch line that was preempted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from batcher.core.request import Request


class WaitingQueue:
    def __init__(self) -> None:
        self._levels: dict[int, deque[Request]] = {}  # priority -> its requests, front first
        self._order: list[int] = []  # the levels present, lowest (most urgent) first

    def _level(self, priority: int) -> deque[Request]:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = deque()
            self._order = sorted(self._levels)
        return level

    def _drop_if_empty(self, priority: int) -> None:
        if not self._levels[priority]:
            del self._levels[priority]
            self._order.remove(priority)

    def append(self, req: Request) -> None:
        """A request that arrived: behind every waiting request of its priority."""
        self._level(req.priority).append(req)

    def appendleft(self, req: Request) -> None:
        """A request put back (preempted, orphaned, retried): first of its priority."""
        self._level(req.priority).appendleft(req)

    def sort_front(self, key: Callable[[Request], Any], limit: int) -> None:
        """Reorder the first `limit` requests of the most urgent priority by `key` (stable)."""
        if not self._order:
            return
        level = self._levels[self._order[0]]
        front = sorted((level.popleft() for _ in range(min(limit, len(level)))), key=key)
        level.extendleft(reversed(front))

    def popleft(self) -> Request:
        if not self._order:
            raise IndexError("pop from an empty waiting queue")
        priority = self._order[0]
        req = self._levels[priority].popleft()
        self._drop_if_empty(priority)
        return req

    def remove(self, req: Request) -> None:
        self._levels[req.priority].remove(req)
        self._drop_if_empty(req.priority)

    def __getitem__(self, index: int) -> Request:
        if index == 0 and self._order:
            return self._levels[self._order[0]][0]
        for i, req in enumerate(self):
            if i == index:
                return req
        raise IndexError("waiting queue index out of range")

    def __iter__(self) -> Iterator[Request]:
        for priority in self._order:
            yield from self._levels[priority]

    def count(self, priority: int) -> int:
        """Requests waiting at this priority."""
        return len(self._levels.get(priority, ()))

    def __len__(self) -> int:
        return sum(len(level) for level in self._levels.values())

    def __bool__(self) -> bool:
        return bool(self._order)

    def __contains__(self, req: object) -> bool:
        return isinstance(req, Request) and req in self._levels.get(req.priority, ())
