"""Turns what the batcher published in Redis into Prometheus metric families, at scrape time.

The batcher writes a flat stats hash (`llm:batcher:stats`, counters and gauges) whenever its state
changes and a JSON MetricsSnapshot (`llm:batcher:metrics`, histograms and per-worker gauges) once a
second; `/metrics` reads both and hands them to a fresh BatcherCollector, so nothing here is shared
between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from common.metrics_schema import ACCEPTED_PER_POS, HistogramData, MetricsSnapshot
from common.spec_decode.spec_decode_stats import counts_from_stats

# stats hash field -> (metric name, kind, help); counters get `_total` from prometheus_client.
_STATS: dict[str, tuple[str, str, str]] = {
    "num_running": ("cbserve:num_requests_running", "gauge", "Requests holding KV-cache blocks on a worker."),
    "num_waiting": ("cbserve:num_requests_waiting", "gauge", "Requests waiting to be scheduled."),
    "num_workers": ("cbserve:num_workers", "gauge", "Workers the batcher is scheduling."),
    "num_preemptions": ("cbserve:num_preemptions", "counter", "Requests preempted (to be recomputed)."),
    "worker_busy_s": ("cbserve:worker_busy_seconds", "counter", "Seconds workers spent computing steps."),
    "worker_idle_s": (
        "cbserve:worker_idle_seconds",
        "counter",
        "Seconds workers waited for their next step.",
    ),
    "num_steps_overlapped": (
        "cbserve:worker_steps_overlapped",
        "counter",
        "Steps a worker built and launched while its previous step still ran on the device.",
    ),
    # Speculative decoding, vLLM's names.
    "spec_decode_num_drafts": ("cbserve:spec_decode_num_drafts", "counter", "Decodes sent with drafts."),
    "spec_decode_num_draft_tokens": ("cbserve:spec_decode_num_draft_tokens", "counter", "Draft tokens sent."),
    "spec_decode_num_accepted_tokens": (
        "cbserve:spec_decode_num_accepted_tokens",
        "counter",
        "Draft tokens the workers accepted.",
    ),
    "spec_decode_num_workers_off": (
        "cbserve:spec_decode_num_workers_off",
        "gauge",
        "Workers whose drafts were accepted too rarely to pay: they draft only to probe.",
    ),
}


def _histogram(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def _add(family: HistogramMetricFamily, labels: list[str], data: HistogramData) -> None:
    buckets = [(_le(bound), float(count)) for bound, count in zip(data.bounds, data.counts, strict=True)]
    buckets.append(("+Inf", float(data.count)))
    family.add_metric(labels, buckets, data.sum)


def _le(bound: float) -> str:
    return repr(float(bound))  # "0.5", "8.0": the spelling prometheus_client uses for its own buckets


class BatcherCollector(Collector):
    def __init__(
        self, stats: Mapping[str, float] | None, snapshot: MetricsSnapshot | None, now: float
    ) -> None:
        self._stats = stats  # None: Redis could not be read
        self._snapshot = snapshot
        self._now = now

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("cbserve:redis_up", "1 if this scrape could read the batcher's metrics.")
        up.add_metric([], 0.0 if self._stats is None else 1.0)
        yield up
        if not self._stats:
            return
        for key, (name, kind, doc) in _STATS.items():
            if key in self._stats:
                family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                yield family(name, doc, value=self._stats[key])
        yield from self._accepted_per_pos(self._stats)
        if "updated_at" in self._stats:
            yield GaugeMetricFamily(
                "cbserve:batcher_stats_age_seconds",
                "Seconds since the batcher last wrote its stats (it rewrites them at least every second).",
                value=max(0.0, self._now - self._stats["updated_at"]),
            )
        if self._snapshot is not None:
            yield from self._snapshot_families(self._snapshot)

    @staticmethod
    def _accepted_per_pos(stats: Mapping[str, float]) -> Iterator[Metric]:
        counts = counts_from_stats(stats).accepted_per_pos
        if not counts:
            return
        family = CounterMetricFamily(
            f"cbserve:{ACCEPTED_PER_POS}",
            "Drafts accepted at each position of their step.",
            labels=["position"],
        )
        for position, count in enumerate(counts):
            family.add_metric([str(position)], count)
        yield family

    @staticmethod
    def _snapshot_families(snap: MetricsSnapshot) -> Iterator[Metric]:
        queue = _histogram(
            "cbserve:request_queue_time_seconds",
            "Time from a request's arrival at the batcher to its first scheduling.",
            [],
        )
        _add(queue, [], snap.queue_time)
        yield queue
        kv = _per_worker(
            GaugeMetricFamily, "kv_cache_usage_perc", "Fraction of the worker's KV-cache blocks in use (0-1)."
        )
        running = _per_worker(
            GaugeMetricFamily, "worker_num_requests_running", "Requests holding blocks on the worker."
        )
        step_time = _histogram(
            "cbserve:step_time_seconds",
            "Forward + sampling time of one step, as the worker reports it.",
            ["worker_id"],
        )
        # vLLM's names: prompt tokens looked up in, and found in, the worker's prefix cache.
        queries = _per_worker(
            CounterMetricFamily,
            "prefix_cache_queries",
            "Prompt tokens of requests admitted on the worker (recomputes included).",
        )
        hits = _per_worker(
            CounterMetricFamily, "prefix_cache_hits", "Of those, tokens found in its prefix cache."
        )
        cached = _per_worker(
            GaugeMetricFamily,
            "kv_cache_cached_blocks",
            "Free KV-cache blocks still holding a reusable prefix.",
        )
        # A vision-language model's images: run through the vision encoder, or found in its cache.
        encoder_runs = _per_worker(
            CounterMetricFamily, "encoder_runs", "Images the worker ran through its vision encoder."
        )
        encoder_hits = _per_worker(
            CounterMetricFamily, "encoder_cache_hits", "Images a step found in the worker's encoder cache."
        )
        batch_size = _histogram("cbserve:batch_size", "Requests in one step.", ["worker_id"])
        tokens = _histogram("cbserve:iteration_tokens_total", "Tokens computed in one step.", ["worker_id"])
        for worker_id, w in sorted(snap.workers.items()):
            used = w.num_blocks - w.num_free_blocks
            kv.add_metric([worker_id], used / w.num_blocks if w.num_blocks else 0.0)
            running.add_metric([worker_id], float(w.num_running))
            queries.add_metric([worker_id], float(w.prefix_cache_queries))
            hits.add_metric([worker_id], float(w.prefix_cache_hits))
            cached.add_metric([worker_id], float(w.num_cached_blocks))
            encoder_runs.add_metric([worker_id], float(w.num_encoder_runs))
            encoder_hits.add_metric([worker_id], float(w.num_encoder_cache_hits))
            _add(step_time, [worker_id], w.step_time)
            _add(batch_size, [worker_id], w.batch_size)
            _add(tokens, [worker_id], w.num_tokens)
        yield from (
            kv,
            running,
            queries,
            hits,
            cached,
            encoder_runs,
            encoder_hits,
            step_time,
            batch_size,
            tokens,
        )


def _per_worker(
    family: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str, doc: str
) -> GaugeMetricFamily | CounterMetricFamily:
    return family(f"cbserve:{name}", doc, labels=["worker_id"])
