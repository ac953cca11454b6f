"""What the batcher publishes for /metrics (`llm:batcher:metrics`): cumulative histograms and per-worker
gauges, as one JSON document so `redis-cli GET` stays readable and a departed worker simply drops out."""

from __future__ import annotations

from typing import Final

import msgspec

# The stats hash's field prefix of vLLM's per-position draft acceptance: `<prefix>:<position>`.
ACCEPTED_PER_POS: Final = "spec_decode_num_accepted_tokens_per_pos"


class HistogramData(msgspec.Struct, kw_only=True):
    bounds: list[float]  # bucket upper bounds, ascending; +Inf is implied
    counts: list[int]  # observations <= each bound (cumulative), parallel to bounds
    count: int  # all observations: the +Inf bucket
    sum: float  # of all observed values


class WorkerMetrics(msgspec.Struct, kw_only=True):
    num_blocks: int  # KV-cache blocks in its pool
    num_free_blocks: int  # of which free now (cached blocks no request holds included)
    num_cached_blocks: int = 0  # of which free but holding a reusable prefix
    prefix_cache_queries: int = 0  # prompt tokens of requests admitted on it (cumulative)
    prefix_cache_hits: int = 0  # of which found in its prefix cache (cumulative)
    num_running: int  # requests holding blocks on it
    num_encoder_runs: int = 0  # images it ran through its vision encoder (cumulative)
    num_encoder_cache_hits: int = 0  # images its steps found in its encoder cache (cumulative)
    step_time: HistogramData  # seconds of forward + sample per step, as the worker reported
    batch_size: HistogramData  # requests per step
    num_tokens: HistogramData  # tokens computed per step (prefill chunks + decodes)


class MetricsSnapshot(msgspec.Struct, kw_only=True):
    updated_at: float  # unix seconds
    queue_time: HistogramData  # seconds from a request's arrival at the batcher to its first scheduling
    workers: dict[str, WorkerMetrics]  # worker id -> its metrics
    # vLLM's lora_requests_info: the adapters (names) of running and of waiting requests, and the most
    # adapters one step of its workers may hold (0: none serves adapters).
    running_lora_adapters: list[str] = []
    waiting_lora_adapters: list[str] = []
    max_lora: int = 0


encode_snapshot = msgspec.json.Encoder().encode
decode_snapshot = msgspec.json.Decoder(MetricsSnapshot).decode
