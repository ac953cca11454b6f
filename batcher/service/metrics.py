"""Histograms the batcher keeps for /metrics, published to Redis at most once per interval.

Observing is a bisect and two additions per step; publishing is one SET of a JSON snapshot added to
the pipeline the batcher executes anyway, so metrics cost no extra round trip and no write per step.
The batcher does not import prometheus_client: the gateway turns the snapshot into metric families.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from batcher.core.request import Request
from batcher.core.scheduler import Scheduler
from common import streams
from common.metrics_schema import HistogramData, MetricsSnapshot, WorkerMetrics, encode_snapshot
from common.protocol import ModelRunnerOutput, SchedulerOutput

# Scrapers poll every 10-60 s; a second of staleness is invisible to them.
PUBLISH_INTERVAL_S = 1.0

QUEUE_TIME_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
STEP_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
NUM_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last is +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (Prometheus' `le`).
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def data(self) -> HistogramData:
        cumulative = list(itertools.accumulate(self.counts))
        return HistogramData(
            bounds=list(self.bounds), counts=cumulative[:-1], count=cumulative[-1], sum=self.total
        )


@dataclass(slots=True)
class WorkerHistograms:
    step_time: Histogram = field(default_factory=lambda: Histogram(STEP_TIME_BUCKETS))
    batch_size: Histogram = field(default_factory=lambda: Histogram(BATCH_SIZE_BUCKETS))
    num_tokens: Histogram = field(default_factory=lambda: Histogram(NUM_TOKENS_BUCKETS))


class BatcherMetrics:
    """Fed by the batcher's loop (steps sent, results received); reads gauges from the scheduler."""

    def __init__(self, scheduler: Scheduler, interval_s: float = PUBLISH_INTERVAL_S) -> None:
        self._scheduler = scheduler
        self._interval_s = interval_s
        self._next_publish = 0.0
        self.queue_time = Histogram(QUEUE_TIME_BUCKETS)
        self.workers: dict[str, WorkerHistograms] = {}

    def on_step_sent(self, worker_id: str, out: SchedulerOutput, now: float) -> None:
        hists = self.workers.setdefault(worker_id, WorkerHistograms())
        hists.batch_size.observe(len(out.num_scheduled_tokens))
        hists.num_tokens.observe(out.total_num_scheduled_tokens)
        for new in out.scheduled_new_reqs:
            req = self._scheduler.requests.get(new.req_id)
            if new.attempt == 1 and req is not None:  # first scheduling only, not a recompute
                self.queue_time.observe(max(0.0, now - req.queued_at))

    def on_step_result(self, out: ModelRunnerOutput) -> None:
        if out.worker_id in self._scheduler.workers:
            self.workers.setdefault(out.worker_id, WorkerHistograms()).step_time.observe(out.step_time)

    def publish(self, pipe: redis.client.Pipeline, keys: streams.CellKeys, now: float) -> None:
        """Queue the snapshot on `pipe` when the interval has passed since the last one."""
        if now < self._next_publish:
            return
        self._next_publish = now + self._interval_s
        pipe.set(keys.metrics, encode_snapshot(self.snapshot(now)))

    def snapshot(self, now: float) -> MetricsSnapshot:
        workers: dict[str, WorkerMetrics] = {}
        for worker_id in list(self.workers):
            if worker_id not in self._scheduler.workers:
                del self.workers[worker_id]  # gone: its series end with it
        for worker_id, ws in self._scheduler.workers.items():
            hists = self.workers.setdefault(worker_id, WorkerHistograms())
            workers[worker_id] = WorkerMetrics(
                num_blocks=ws.kv_cache_manager.num_blocks,
                num_free_blocks=ws.kv_cache_manager.num_free_blocks,
                num_cached_blocks=ws.kv_cache_manager.num_evictable_blocks,
                prefix_cache_queries=ws.prefix_cache_queries,
                prefix_cache_hits=ws.prefix_cache_hits,
                num_running=len(ws.running),
                num_encoder_runs=ws.num_encoder_runs,
                num_encoder_cache_hits=ws.num_encoder_cache_hits,
                step_time=hists.step_time.data(),
                batch_size=hists.batch_size.data(),
                num_tokens=hists.num_tokens.data(),
            )
        running = [r for ws in self._scheduler.workers.values() for r in ws.running]
        return MetricsSnapshot(
            updated_at=now,
            queue_time=self.queue_time.data(),
            workers=workers,
            running_lora_adapters=_adapter_names(running),
            waiting_lora_adapters=_adapter_names(self._scheduler.waiting),
            max_lora=max((ws.info.max_loras for ws in self._scheduler.workers.values()), default=0),
        )


def _adapter_names(requests: Iterable[Request]) -> list[str]:
    return sorted({r.lora_request.lora_name for r in requests if r.lora_request is not None})
