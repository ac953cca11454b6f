"""`cbserve up` restarts a service that died, within a bound.

A service that exits on its own (a crash, the OOM killer, a bug hit by one request) is started again
as it was first started, after a pause that doubles with each restart of it (1 s, 2 s, 4 s ... 30 s).
One that died `max_restarts` times within `window_s` is broken rather than unlucky: the launcher then
stops everything with that service's log, as it did on any death before. `max_restarts` 0 restores
that.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0


@dataclass
class RestartBudget:
    max_restarts: int  # per service, within window_s
    window_s: float
    _restarts: dict[str, deque[float]] = field(default_factory=dict)  # name -> restart times

    def recent(self, name: str, now: float) -> int:
        """Restarts of `name` within the window ending at `now`."""
        times = self._restarts.setdefault(name, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return len(times)

    def allows(self, name: str, now: float) -> bool:
        return self.recent(name, now) < self.max_restarts

    def delay_s(self, name: str, now: float) -> float:
        """The pause before the next restart of `name`: doubling with its recent restarts."""
        return min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** self.recent(name, now))

    def record(self, name: str, now: float) -> None:
        self._restarts.setdefault(name, deque()).append(now)
