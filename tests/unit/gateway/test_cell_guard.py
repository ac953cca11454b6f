"""Admission's memory headroom: what a request may hold, and when a Redis counts as nearly full."""

from __future__ import annotations

from gateway.limits.cell_guard import BYTES_PER_OUTPUT_TOKEN, BYTES_PER_REQUEST, request_bytes
from gateway.limits.redis_memory import MemoryUse


def test_headroom_is_a_share_of_maxmemory_kept_free() -> None:
    use = MemoryUse(used_bytes=850, max_bytes=1000)
    assert not use.over(0.1)  # 85% used, 10% must stay free
    assert use.over(0.1, extra_bytes=51)  # 90.1%
    assert use.over(0.2)
    assert "85%" in use.describe()


def test_a_redis_without_maxmemory_is_never_full() -> None:
    assert not MemoryUse(used_bytes=10**12, max_bytes=0).over(0.1, extra_bytes=10**12)


def test_a_request_reserves_its_tokens_and_records() -> None:
    one = request_bytes(1, 3, 200)
    assert one >= BYTES_PER_REQUEST + 200 * BYTES_PER_OUTPUT_TOKEN
    # n choices: a record each, their prompt once (the caller counts it once), every output.
    assert request_bytes(4, 3, 800) - one == 3 * BYTES_PER_REQUEST + 600 * BYTES_PER_OUTPUT_TOKEN
