"""The capacity model's cell simulation (benchmarks/pipeline/capacity.py) against cases solved by hand."""

from __future__ import annotations

import pytest

from benchmarks.pipeline.capacity import fit, simulate_cell, workers_per_cell


def test_the_fit_recovers_a_line() -> None:
    cost = fit({1: 1.5, 16: 3.0, 64: 7.8})
    assert (cost.per_step, cost.per_request) == pytest.approx((1.4, 0.1))
    assert cost.at(32) == pytest.approx(4.6)


def test_one_worker_waits_for_its_plan_only_without_async_scheduling() -> None:
    sync = simulate_cell(1, step_ms=20.0, worker_ms=2.0, batcher_ms=1.5, async_scheduling=False)
    assert sync.period_ms == pytest.approx(23.5)
    overlapped = simulate_cell(1, step_ms=20.0, worker_ms=2.0, batcher_ms=1.5, async_scheduling=True)
    assert overlapped.period_ms == pytest.approx(22.0, rel=0.01)


def test_a_saturated_batcher_sets_the_step_period() -> None:
    """Ten workers asking 5 ms of planning per 20 ms step: the batcher can plan one step per 5 ms, so
    each worker steps every 50 ms and the batcher never rests."""
    run = simulate_cell(10, step_ms=20.0, worker_ms=0.0, batcher_ms=5.0, async_scheduling=True)
    assert run.period_ms == pytest.approx(50.0, rel=0.02)
    assert run.batcher_busy == pytest.approx(1.0, rel=0.01)
    assert run.gpu_busy == pytest.approx(0.4, rel=0.02)


def test_a_cell_holds_more_workers_when_steps_are_longer() -> None:
    short, _ = workers_per_cell(10.0, 1.0, 1.0, True, min_gpu_busy=0.95, max_batcher_busy=0.7)
    long, run = workers_per_cell(40.0, 1.0, 1.0, True, min_gpu_busy=0.95, max_batcher_busy=0.7)
    assert short < long
    assert run.batcher_busy <= 0.7
    assert long == pytest.approx(0.7 * 41.0, abs=1.5)  # the batcher's headroom binds, not the GPUs
