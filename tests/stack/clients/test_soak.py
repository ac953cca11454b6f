"""A short soak (`scripts/soak.py` runs the long one): 20 s of steady load with random disconnects.

Real batcher, worker and gateway processes with a 1 s resume window and a 3 s retention window.
Every answer read to its end must be whole, resumed streams included; abandoned requests must be
aborted; and once the windows have passed, no per-request key, stream entry or pending entry may be
left, the batcher must have nothing running or waiting, and Redis's keys must be back to their size
before the load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis

from harness.load.leftovers import batcher_stats, keys_bytes, leftovers, wait_cleared
from harness.load.soak_load import soak
from harness.processes.services import Stack

GRACE_S = 1.0
RETENTION_S = 3


def test_sustained_load_with_disconnects_leaves_nothing_behind(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack()
    env = {"CBSERVE_RETENTION_S": str(RETENTION_S)}
    stack.start_batcher(**env)
    stack.start_worker(**env)
    stack.start_gateway(GATEWAY_RESUME_GRACE_S=str(GRACE_S), **env)
    stack.wait_ready(num_workers=1)
    r = redis.Redis.from_url(stack.redis_url)
    keys_before = keys_bytes(r)

    report = asyncio.run(soak(stack.base_url, duration_s=20, rate=5, grace_s=GRACE_S))

    assert not report.failures, report.failures[:5]
    # Every kind of client ran, and the ones that leave did leave.
    assert all(report.whole[kind] > 0 for kind in ("stream", "complete", "stream_resume")), report.summary()
    assert report.left["stream_abandon"] > 0 and report.left["complete_abandon"] > 0, report.summary()
    assert batcher_stats(r)["num_aborted"] > 0
    assert wait_cleared(r, GRACE_S + RETENTION_S + 30) is not None, leftovers(r)
    # What stays is the services' own state (stats, metrics, a wake and a steps stream), a few KiB.
    assert keys_bytes(r) - keys_before < 64 * 1024
