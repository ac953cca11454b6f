"""When a cell's batcher counts as live, gone or unknown (common/redis_io/batcher_liveness.py)."""

from __future__ import annotations

from common.redis_io.batcher_liveness import BATCHER_SILENT_S, judge

NOW = 1_000_000.0


def test_fresh_stats_or_a_held_lease_is_live() -> None:
    assert judge(str(NOW - 1), leased=False, num_registered=0, now=NOW) == "live"
    # Redis full: the leader's stats are stale but it renews its lease.
    assert judge(str(NOW - 60), leased=True, num_registered=1, now=NOW) == "live"
    assert judge(None, leased=True, num_registered=0, now=NOW) == "live"  # a new leader, no stats yet


def test_stale_stats_without_a_lease_is_gone() -> None:
    assert judge(b"%f" % (NOW - BATCHER_SILENT_S - 0.1), leased=False, num_registered=0, now=NOW) == "gone"


def test_workers_waiting_for_a_batcher_that_never_came_is_gone() -> None:
    assert judge(None, leased=False, num_registered=2, now=NOW) == "gone"


def test_a_cell_nobody_ever_served_is_not_judged() -> None:
    assert judge(None, leased=False, num_registered=0, now=NOW) == "unknown"
