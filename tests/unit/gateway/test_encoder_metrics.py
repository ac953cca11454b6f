"""A vision-language worker's encoder counters in /metrics: the batcher's snapshot (the workers' step
results summed) rendered as Prometheus counters per worker."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from common.metrics_schema import HistogramData, MetricsSnapshot, WorkerMetrics
from gateway.observability.batcher_collector import BatcherCollector

EMPTY = HistogramData(bounds=[1.0], counts=[0], count=0, sum=0.0)


def test_encoder_runs_and_cache_hits_are_counters_per_worker() -> None:
    worker = WorkerMetrics(
        num_blocks=8,
        num_free_blocks=8,
        num_running=0,
        num_encoder_runs=3,
        num_encoder_cache_hits=5,
        step_time=EMPTY,
        batch_size=EMPTY,
        num_tokens=EMPTY,
    )
    snapshot = MetricsSnapshot(updated_at=0.0, queue_time=EMPTY, workers={"w0": worker})
    registry = CollectorRegistry()
    registry.register(BatcherCollector({"num_steps": 1.0}, snapshot, now=0.0))
    samples = {
        (s.name, s.labels.get("worker_id")): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    assert samples[("cbserve:encoder_runs_total", "w0")] == 3
    assert samples[("cbserve:encoder_cache_hits_total", "w0")] == 5
