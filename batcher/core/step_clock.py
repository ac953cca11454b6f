"""When to plan a worker's next step under async scheduling. No I/O.

Planning step N+2 as soon as step N+1 starts makes every request that arrives during N+1 wait for
N+3: a whole extra step of time to first token. So the next step is planned shortly before the
running one is expected to end (its start plus the worker's recent step period, less a lead), which
still reaches the worker before it is idle; a step that ends early is answered at once, as without
async scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass

# Weight of the newest step period in the moving average.
_EMA_ALPHA = 0.3
# Plan at least this long before the expected end: the batcher's planning and its 1 ms wake-up
# (service/inbox.py), a Redis round trip, and the worker's building and launching of the step
# while the device ends the one before (gpu_worker/runner/step/launched.py).
MIN_LEAD_S = 0.005


@dataclass(slots=True)
class StepClock:
    """One worker's step timing as the batcher sees it: when its current step began, how long steps take."""

    busy_since: float | None = None  # when the oldest step in flight started (None: none in flight)
    period_s: float | None = None  # moving average of a step's time from its start to its result

    def on_sent(self, now: float, num_in_flight_before: int) -> None:
        """A step was sent; with nothing else in flight the worker starts it at once."""
        if num_in_flight_before == 0:
            self.busy_since = now

    def on_result(self, now: float, num_in_flight_after: int) -> None:
        """A step's result arrived; a step already queued behind it started when it ended."""
        if self.busy_since is not None:
            elapsed = now - self.busy_since
            self.period_s = elapsed if self.period_s is None else _ema(self.period_s, elapsed)
        self.busy_since = now if num_in_flight_after > 0 else None

    def plan_at(self, lead: float) -> float | None:
        """When to plan the step to follow the one running: None means now (no estimate yet).

        `lead` is the fraction of a step period to plan ahead of the running step's expected end;
        1.0 plans as soon as it starts."""
        if self.busy_since is None or self.period_s is None or lead >= 1.0:
            return None
        ahead = max(MIN_LEAD_S, lead * self.period_s)
        return self.busy_since + self.period_s - ahead


def _ema(average: float, sample: float) -> float:
    return (1 - _EMA_ALPHA) * average + _EMA_ALPHA * sample
