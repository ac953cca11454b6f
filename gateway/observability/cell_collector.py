"""Each cell's load under vLLM's metric names, the model-server protocol of the Kubernetes Gateway API
Inference Extension (GIE), so an endpoint picker or autoscaler built for vLLM reads a cbserve gateway.

The protocol asks a model server for three gauges: TotalQueuedRequests (`vllm:num_requests_waiting`),
TotalRunningRequests (`vllm:num_requests_running`) and KVCacheUtilization (`vllm:kv_cache_usage_perc`,
0-1). One series per cell the gateway serves, labelled `model_name` (as vLLM does) and `cell`; a
cell's KV usage is over all its workers' blocks together. Read at scrape time from each cell's stats
hash and metrics snapshot, like `BatcherCollector`. A cell serves one base model: its series carry
that model's name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.metrics_schema import MetricsSnapshot

LABELS = ["model_name", "cell"]


@dataclass(frozen=True, slots=True)
class CellReading:
    """What one cell's batcher published: its stats hash (empty: none ever wrote) and snapshot."""

    cell: str
    stats: Mapping[str, float]
    snapshot: MetricsSnapshot | None
    model_name: str = ""  # the base model the cell serves


def kv_cache_usage(snapshot: MetricsSnapshot | None) -> float:
    """Fraction of the cell's KV-cache blocks in use, over all its workers (0 with no worker)."""
    if snapshot is None:
        return 0.0
    total = sum(w.num_blocks for w in snapshot.workers.values())
    used = sum(w.num_blocks - w.num_free_blocks for w in snapshot.workers.values())
    return used / total if total else 0.0


class CellCollector(Collector):
    def __init__(self, readings: Sequence[CellReading]) -> None:
        self._readings = readings

    def collect(self) -> Iterator[Metric]:
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Requests of the cell waiting to be scheduled.", labels=LABELS
        )
        running = GaugeMetricFamily(
            "vllm:num_requests_running",
            "Requests of the cell holding KV-cache blocks on a worker.",
            labels=LABELS,
        )
        kv = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc",
            "Fraction of the cell's KV-cache blocks in use, all its workers together (0-1).",
            labels=LABELS,
        )
        # vLLM's: which adapters run and wait, as labels; the value is when that was true (unix seconds).
        lora = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running and waiting LoRA adapters of the cell (comma-separated) and its max_lora.",
            labels=[*LABELS, "max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )
        for reading in self._readings:
            if not reading.stats:
                continue  # no batcher of this cell has written yet: nothing true to say
            labels = [reading.model_name, reading.cell]
            waiting.add_metric(labels, reading.stats.get("num_waiting", 0.0))
            running.add_metric(labels, reading.stats.get("num_running", 0.0))
            kv.add_metric(labels, kv_cache_usage(reading.snapshot))
            snap = reading.snapshot
            if snap is not None and snap.max_lora > 0:
                adapters = [",".join(snap.waiting_lora_adapters), ",".join(snap.running_lora_adapters)]
                lora.add_metric([*labels, str(snap.max_lora), *adapters], snap.updated_at)
        yield from (waiting, running, kv)
        if lora.samples:  # only where adapters are served, as vLLM registers it only with LoRA on
            yield lora
