"""Arrival times: all at once, Poisson, or Gamma-distributed gaps, precomputed from a seed.

As in vLLM's `get_request`: gaps are Gamma(shape=burstiness, scale=1 / (rate * burstiness)), which is
the exponential (a Poisson process) at burstiness 1; below 1 arrivals bunch up, above 1 they even out.
The cumulative times are then rescaled so the last arrival lands exactly at `num / rate`, which keeps
the offered load identical across seeds (vLLM does the same to stabilise throughput figures).
Precomputing the schedule, rather than sampling while sending, is what makes every system in a
comparison see the same arrival times.
"""

from __future__ import annotations

import math

import numpy as np

ARRIVAL_RNG_STREAM = 2  # see datasets._rng: streams 0 and 1 are lengths and token ids


def arrival_times(num: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of `num` requests is sent."""
    if num < 1:
        return []
    if request_rate <= 0:
        raise ValueError(f"--request-rate must be > 0 (or inf), got {request_rate}")
    if burstiness <= 0:
        raise ValueError(f"--burstiness must be > 0, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num
    if math.isinf(burstiness):
        gaps = np.full(num, 1.0 / request_rate)
    else:
        rng = np.random.default_rng([seed, ARRIVAL_RNG_STREAM])
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num)
    times = np.cumsum(gaps)
    times *= (num / request_rate) / times[-1]
    return [float(t) for t in times]
