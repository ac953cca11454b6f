"""The gateway's own request metrics, with vLLM's names under a `cbserve:` prefix.

Latencies are measured where the client sees them: from the HTTP arrival to the token events this
gateway reads. Each app owns a registry (no process-global state), so tests can run several apps.
Gateways that share a port (`cbserve up --gateways N`) also share PROMETHEUS_MULTIPROC_DIR: each
writes its values there and a scrape of any of them adds up all (prometheus_client's multiprocess
mode), since the kernel deals a scraper's connection to any one of them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess

# vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards built for it read these the same way.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# The label every per-request metric carries, as vLLM's do.
MODEL = ("model_name",)
REDIS_RTT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(slots=True, frozen=True)
class ModelSeries:
    """One base model's per-request series (vLLM's `model_name` label; an adapter's requests count
    under their base model, as vLLM counts them)."""

    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter
    success: Counter  # the family: its `finished_reason` label is chosen per request
    model_name: str

    def count_finished(self, finished_reason: str) -> None:
        self.success.labels(self.model_name, finished_reason).inc()


class GatewayMetrics:
    def __init__(self, *model_names: str) -> None:
        """Metrics of the requests for `model_names`, each model's series there (at 0) from the start."""
        self.registry = CollectorRegistry()
        self._ttft = self._latency(
            "cbserve:time_to_first_token_seconds",
            "Time from the request's arrival at the gateway to its first token.",
            TTFT_BUCKETS,
        )
        self._itl = self._latency(
            "cbserve:inter_token_latency_seconds",
            "Time between output tokens (one observation per token after the first).",
            ITL_BUCKETS,
        )
        self._e2e = self._latency(
            "cbserve:e2e_request_latency_seconds",
            "Time from the request's arrival at the gateway to its last token.",
            E2E_BUCKETS,
        )
        self._prompt_tokens = self._tokens(
            "cbserve:prompt_tokens", "Prompt tokens of requests that got a first token (or were pooled)."
        )
        self._generation_tokens = self._tokens(
            "cbserve:generation_tokens", "Generated tokens (the EOS / stop token included)."
        )
        self._success = Counter(
            "cbserve:request_success",
            "Requests that ended, by finish reason (stop, length, abort, error).",
            [*MODEL, "finished_reason"],
            registry=self.registry,
        )
        self.redis_rtt = Histogram(
            "cbserve:redis_rtt_seconds",
            "Round-trip time of a PING from this gateway to Redis, measured on every scrape.",
            buckets=REDIS_RTT_BUCKETS,
            registry=self.registry,
        )
        self._series: dict[str, ModelSeries] = {}
        for name in model_names:
            self.series(name)

    def series(self, model_name: str) -> ModelSeries:
        """The model's series, made the first time it is asked for."""
        found = self._series.get(model_name)
        if found is None:
            found = self._series[model_name] = ModelSeries(
                ttft=self._ttft.labels(model_name),
                itl=self._itl.labels(model_name),
                e2e=self._e2e.labels(model_name),
                prompt_tokens=self._prompt_tokens.labels(model_name),
                generation_tokens=self._generation_tokens.labels(model_name),
                success=self._success,
                model_name=model_name,
            )
        return found

    def exposition(self) -> bytes:
        """These metrics in Prometheus' text format, summed over every gateway sharing the directory."""
        shared_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not shared_dir:
            return bytes(generate_latest(self.registry))
        summed = CollectorRegistry()
        multiprocess.MultiProcessCollector(summed, path=shared_dir)
        return bytes(generate_latest(summed))

    def _latency(self, name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
        """A histogram of requests, in seconds, per model."""
        return Histogram(name, documentation, MODEL, buckets=buckets, registry=self.registry)

    def _tokens(self, name: str, documentation: str) -> Counter:
        """A count of tokens, per model."""
        return Counter(name, documentation, MODEL, registry=self.registry)

    def count_pooled(
        self, model_name: str, arrival_time: float, num_prompt_tokens: list[int], finished_reason: str
    ) -> None:
        """Pooling requests of one call, ended together (their answer is one): each counted as a
        request of `model_name` with its end-to-end latency; no TTFT or inter-token latency, as they
        stream no tokens, and their prompt tokens only when they were pooled."""
        series = self.series(model_name)
        e2e = max(0.0, time.time() - arrival_time)
        for num_tokens in num_prompt_tokens:
            series.e2e.observe(e2e)
            series.count_finished(finished_reason)
            if finished_reason == "stop":
                series.prompt_tokens.inc(num_tokens)

    def track(self, arrival_time: float, num_prompt_tokens: int, model_name: str) -> RequestTracker:
        """A tracker for one request of base model `model_name` that arrived at `arrival_time` (unix
        seconds)."""
        # Arrival is a wall-clock stamp; latencies are then kept on the monotonic clock.
        start = time.monotonic() - max(0.0, time.time() - arrival_time)
        return RequestTracker(self.series(model_name), start, num_prompt_tokens)


@dataclass(slots=True)
class RequestTracker:
    """Latency bookkeeping of one request: fed the tokens as they are read, told once when it ends."""

    metrics: ModelSeries  # its model's series
    start: float  # monotonic time of arrival
    num_prompt_tokens: int
    first_token_at: float | None = None
    last_token_at: float | None = None
    num_output_tokens: int = 0
    finished: bool = False

    def on_tokens(self, num_tokens: int, now: float | None = None, first_at: float | None = None) -> None:
        """`num_tokens` new output tokens arrived in one read, at `now`; `first_at`: when the first of
        them was made, for tokens read long after (an answer read whole at its end)."""
        if num_tokens <= 0:
            return
        now = time.monotonic() if now is None else now
        m = self.metrics
        remaining = num_tokens
        if self.last_token_at is None:
            # Between arrival and now, whatever the clocks of the gateway and Redis say.
            self.first_token_at = now if first_at is None else min(max(first_at, self.start), now)
            m.ttft.observe(self.first_token_at - self.start)
            m.prompt_tokens.inc(self.num_prompt_tokens)
            remaining -= 1
            # Read together with the first token: no time between them was seen, unless it was made
            # earlier (first_at).
            since = self.first_token_at
        else:
            since = self.last_token_at
        if remaining:
            # Tokens read together share the gap since the previous one, so the observations sum to
            # the decode time and there is one per token after the first.
            observe_many(m.itl, (now - since) / remaining, remaining)
        m.generation_tokens.inc(num_tokens)
        self.num_output_tokens += num_tokens
        self.last_token_at = now

    def finish(self, finished_reason: str, now: float | None = None) -> float:
        """Count the request as ended (once); returns its end-to-end latency in seconds."""
        now = time.monotonic() if now is None else now
        e2e = now - self.start
        if not self.finished:
            self.finished = True
            self.metrics.e2e.observe(e2e)
            self.metrics.count_finished(finished_reason)
        return e2e

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.start


def observe_many(histogram: Histogram, amount: float, count: int) -> None:
    """`count` observations of `amount` at the cost of one: the tokens of a read share one gap, and a
    call per token cost the gateway's CPU per token. prometheus_client observes one at a time, so this
    adds to the child's sum and bucket as its `observe` does (tests/stack/observability/test_metrics.py
    checks it against `count` calls)."""
    histogram._raise_if_not_observable()  # a parent with labels has no buckets of its own
    histogram._sum.inc(amount * count)
    for bucket, bound in zip(histogram._buckets, histogram._upper_bounds, strict=True):
        if amount <= bound:
            bucket.inc(count)
            return
