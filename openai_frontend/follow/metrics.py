"""What the request follower reports about the requests it follows, to whoever counts them.

The gateway counts its clients' requests (gateway/observability/metrics.py implements these); a
batch task counts nothing and passes no metrics.
"""

from __future__ import annotations

from typing import Protocol


class TrackedRequest(Protocol):
    """Latency bookkeeping of one request: fed the tokens as they are read, told once when it ends."""

    num_prompt_tokens: int
    num_output_tokens: int

    @property
    def ttft(self) -> float | None: ...

    def on_tokens(self, num_tokens: int, now: float | None = None, first_at: float | None = None) -> None:
        """`num_tokens` new output tokens read at `now`; `first_at`: when the first of them was made, for
        tokens read long after (an answer read whole at its end)."""
        ...

    def finish(self, finished_reason: str, now: float | None = None) -> float: ...


class RequestMetrics(Protocol):
    def track(self, arrival_time: float, num_prompt_tokens: int, model_name: str) -> TrackedRequest:
        """A tracker for one request of base model `model_name` that arrived at `arrival_time` (unix
        seconds)."""
        ...
