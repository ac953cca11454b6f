"""Pooling requests in the gateway's request metrics: counted and timed as requests of their model,
with no time to a first token or between tokens (they stream none)."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from gateway.observability.metrics import GatewayMetrics


def test_pooling_requests_count_as_requests_of_their_model_without_token_latencies() -> None:
    metrics = GatewayMetrics("emb")
    metrics.count_pooled("emb", time.time() - 0.5, [3, 4], "stop")
    metrics.count_pooled("emb", time.time(), [9], "error")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"model_name": "emb", **labels}.items())))]

    assert value("cbserve:request_success_total", finished_reason="stop") == 2
    assert value("cbserve:request_success_total", finished_reason="error") == 1
    assert value("cbserve:e2e_request_latency_seconds_count") == 3
    assert value("cbserve:e2e_request_latency_seconds_sum") >= 1.0  # two of them 0.5 s after arrival
    assert value("cbserve:prompt_tokens_total") == 7  # of those pooled; the failed one read nothing
    assert value("cbserve:time_to_first_token_seconds_count") == 0
    assert value("cbserve:inter_token_latency_seconds_count") == 0
