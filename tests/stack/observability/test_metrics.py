"""GET /metrics on the real stack: counters match the usage the API returned; histograms count steps."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable

import httpx
import msgspec
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from batcher.service.metrics import Histogram
from common.metrics_schema import HistogramData, MetricsSnapshot, WorkerMetrics
from gateway.observability.batcher_collector import BatcherCollector
from gateway.observability.cell_collector import CellCollector, CellReading, kv_cache_usage
from gateway.observability.metrics import GatewayMetrics, RequestTracker, observe_many
from harness.processes.services import Stack, wait_for

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
MAX_TOKENS = [4, 6, 3]


def scrape(base_url: str) -> list[Sample]:
    response = httpx.get(f"{base_url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return [s for family in text_string_to_metric_families(response.text) for s in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The one sample called `name` whose labels include `labels` (None when there is none)."""
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(found) <= 1, f"{name} {labels} is ambiguous: {found}"
    return found[0] if found else None


def bucket(samples: list[Sample], name: str, le: str, **labels: str) -> float | None:
    return value(samples, f"{name}_bucket", le=le, **labels)


async def _send(base_url: str) -> list[dict[str, int]]:
    """Three plain completions and one streamed chat, all greedy to max_tokens; returns their usage."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        bodies = [
            {"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True}
            for p, n in zip(PROMPTS, MAX_TOKENS, strict=True)
        ]
        responses = await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        usages = [r.json()["usage"] for r in responses]
        chat = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", "/v1/chat/completions", json=chat) as response:
            lines = [line async for line in response.aiter_lines() if line.startswith("data: {")]
        usages.append(json.loads(lines[-1].removeprefix("data: "))["usage"])
    return usages


def test_metrics_match_what_was_served(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack().start_all()
    [worker_id] = [k.removeprefix("num_steps:") for k in stack.stats() if k.startswith("num_steps:")]

    usages = asyncio.run(_send(stack.base_url))
    num_requests = len(usages)
    prompt_tokens = sum(u["prompt_tokens"] for u in usages)
    generation_tokens = sum(u["completion_tokens"] for u in usages)
    assert generation_tokens == sum(MAX_TOKENS) + 5

    # The batcher publishes its snapshot about once a second: wait until it covers every step.
    def batcher_caught_up() -> bool:
        samples = scrape(stack.base_url)
        num_steps = stack.stats()[f"num_steps:{worker_id}"]
        return (
            value(samples, "cbserve:request_queue_time_seconds_count") == num_requests
            and value(samples, "cbserve:step_time_seconds_count", worker_id=worker_id) == num_steps
            and value(samples, "cbserve:batch_size_count", worker_id=worker_id) == num_steps
            and value(samples, "cbserve:num_requests_running") == 0
        )

    wait_for(batcher_caught_up, 15, "the batcher's metrics to cover every step", interval=0.2)
    samples = scrape(stack.base_url)
    model = {"model_name": stack.model_dir.name}

    # Counters equal the usage the API reported.
    assert value(samples, "cbserve:prompt_tokens_total", **model) == prompt_tokens
    assert value(samples, "cbserve:generation_tokens_total", **model) == generation_tokens
    assert value(samples, "cbserve:request_success_total", finished_reason="length", **model) == num_requests
    assert value(samples, "cbserve:request_success_total", finished_reason="stop", **model) is None

    # One TTFT and one e2e per request; one inter-token latency per token after each request's first.
    assert value(samples, "cbserve:time_to_first_token_seconds_count", **model) == num_requests
    assert value(samples, "cbserve:e2e_request_latency_seconds_count", **model) == num_requests
    itl_count = value(samples, "cbserve:inter_token_latency_seconds_count", **model)
    assert itl_count == generation_tokens - num_requests
    ttft_sum = value(samples, "cbserve:time_to_first_token_seconds_sum", **model)
    e2e_sum = value(samples, "cbserve:e2e_request_latency_seconds_sum", **model)
    assert ttft_sum is not None and e2e_sum is not None and 0 < ttft_sum <= e2e_sum
    assert bucket(samples, "cbserve:e2e_request_latency_seconds", "+Inf", **model) == num_requests

    # Per worker: every step computed prompt + output tokens, except each request's last sample and
    # the prompt tokens found in the prefix cache, which the usage reported too.
    cached_tokens = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert value(samples, "cbserve:prefix_cache_queries_total", worker_id=worker_id) == prompt_tokens
    assert value(samples, "cbserve:prefix_cache_hits_total", worker_id=worker_id) == cached_tokens
    tokens_sum = value(samples, "cbserve:iteration_tokens_total_sum", worker_id=worker_id)
    assert tokens_sum == prompt_tokens + generation_tokens - num_requests - cached_tokens
    assert value(samples, "cbserve:kv_cache_usage_perc", worker_id=worker_id) == 0.0
    assert value(samples, "cbserve:worker_num_requests_running", worker_id=worker_id) == 0
    assert (
        bucket(samples, "cbserve:batch_size", "+Inf", worker_id=worker_id)
        == stack.stats()[f"num_steps:{worker_id}"]
    )

    # Gauges and counters from the stats hash; Redis round trips measured on every scrape.
    assert value(samples, "cbserve:num_requests_waiting") == 0
    assert value(samples, "cbserve:num_workers") == 1
    assert value(samples, "cbserve:num_preemptions_total") == 0
    assert value(samples, "cbserve:redis_up") == 1
    rtt_count = value(samples, "cbserve:redis_rtt_seconds_count")
    assert rtt_count is not None and rtt_count >= 2
    age = value(samples, "cbserve:batcher_stats_age_seconds")
    assert age is not None and 0 <= age < 5

    # The Gateway API Inference Extension's names, one series per cell (here the default one alone).
    gie = {"model_name": stack.model_dir.name, "cell": "default"}
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert [s.labels for s in samples if s.name == name] == [gie], name
        assert value(samples, name, **gie) == 0


def test_gauges_show_a_running_request(make_stack: Callable[[], Stack]) -> None:
    # The worker is paused below; a long heartbeat timeout keeps the batcher from declaring it dead.
    stack = make_stack().start_all(batcher_env={"BATCHER_HEARTBEAT_TIMEOUT_S": "60"})
    worker = stack.procs["worker0"]

    def running_seen() -> bool:
        return value(scrape(stack.base_url), "cbserve:worker_num_requests_running") == 1

    body = {
        "prompt": list(range(5, 40)),
        "max_tokens": 100,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{stack.base_url}/v1/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
        # Freeze the worker mid-request, so the request holds its blocks for as long as we look.
        os.kill(worker.pid, signal.SIGSTOP)
        try:

            def running_seen() -> bool:
                samples = scrape(stack.base_url)
                return value(samples, "cbserve:worker_num_requests_running") == 1

            wait_for(running_seen, 15, "the running request in the batcher's metrics", interval=0.2)
            samples = scrape(stack.base_url)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        assert [line for line in lines if line][-1] == "data: [DONE]"
    assert value(samples, "cbserve:num_requests_running") == 1
    usage = value(samples, "cbserve:kv_cache_usage_perc")
    assert usage is not None and 0 < usage < 1
    # The cell's series in the GIE's names: its one worker's blocks are the cell's blocks.
    assert value(samples, "vllm:num_requests_running", cell="default") == 1
    assert value(samples, "vllm:num_requests_waiting", cell="default") == 0
    assert value(samples, "vllm:kv_cache_usage_perc", cell="default") == usage
    assert value(samples, "cbserve:time_to_first_token_seconds_count") == 1
    assert value(samples, "cbserve:e2e_request_latency_seconds_count") == 0


def test_histogram_buckets_are_cumulative_and_inclusive() -> None:
    hist = Histogram((1.0, 2.0, 4.0))
    for v in (0.5, 1.0, 1.5, 2.0, 3.0, 9.0):
        hist.observe(v)
    data = hist.data()
    assert data.counts == [2, 4, 5]  # `le` buckets: a value equal to a bound falls in that bucket
    assert data.count == 6 and data.sum == 17.0


def test_tokens_read_together_share_the_gap_since_the_previous_read() -> None:
    metrics = GatewayMetrics("m")
    tracker = RequestTracker(metrics.series("m"), start=10.0, num_prompt_tokens=7)
    tracker.on_tokens(1, now=10.5)  # first token: TTFT 0.5
    tracker.on_tokens(3, now=11.25)  # three tokens in one read: three gaps of 0.25
    assert tracker.finish("length", now=11.25) == 1.25
    tracker.finish("length", now=12.0)  # counted once
    samples = [
        s
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in f.samples
    ]
    assert value(samples, "cbserve:time_to_first_token_seconds_sum") == 0.5
    assert value(samples, "cbserve:inter_token_latency_seconds_count") == 3
    assert bucket(samples, "cbserve:inter_token_latency_seconds", "0.2") == 0
    assert bucket(samples, "cbserve:inter_token_latency_seconds", "0.3") == 3
    assert value(samples, "cbserve:generation_tokens_total") == 4
    assert value(samples, "cbserve:prompt_tokens_total") == 7
    assert value(samples, "cbserve:request_success_total", finished_reason="length") == 1
    assert value(samples, "cbserve:e2e_request_latency_seconds_count") == 1


def test_tokens_read_with_the_first_count_as_inter_token_gaps_of_zero() -> None:
    metrics = GatewayMetrics("m")
    tracker = RequestTracker(metrics.series("m"), start=10.0, num_prompt_tokens=7)
    tracker.on_tokens(3, now=10.5)  # the first token and two more in one read
    tracker.on_tokens(1, now=11.0)
    samples = [
        s
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in f.samples
    ]
    # One observation per token after the first, however the tokens were read.
    assert value(samples, "cbserve:inter_token_latency_seconds_count") == 3
    assert value(samples, "cbserve:inter_token_latency_seconds_sum") == 0.5


def test_an_answer_read_whole_is_timed_by_when_its_first_token_was_made() -> None:
    metrics = GatewayMetrics("m")
    tracker = RequestTracker(metrics.series("m"), start=10.0, num_prompt_tokens=7)
    tracker.on_tokens(4, now=12.0, first_at=10.5)  # read at its end; the first token made at 10.5
    assert tracker.ttft == 0.5
    samples = [
        s
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in f.samples
    ]
    assert value(samples, "cbserve:time_to_first_token_seconds_sum") == 0.5
    assert value(samples, "cbserve:inter_token_latency_seconds_count") == 3
    assert value(samples, "cbserve:inter_token_latency_seconds_sum") == 1.5
    assert bucket(samples, "cbserve:inter_token_latency_seconds", "0.5") == 3


@pytest.mark.parametrize("amount", [0.0, 0.01, 0.3, 7.0, 1e6])
def test_observe_many_equals_as_many_observes(amount: float) -> None:
    one_by_one, batched = GatewayMetrics("m"), GatewayMetrics("m")
    for _ in range(5):
        one_by_one.series("m").itl.observe(amount)
    observe_many(batched.series("m").itl, amount, 5)

    def itl_samples(metrics: GatewayMetrics) -> list[tuple[str, dict[str, str], float]]:
        text = generate_latest(metrics.registry).decode()
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        # `_created` is when each was made, not what was observed
        return [
            (s.name, s.labels, s.value)
            for s in samples
            if "inter_token" in s.name and "created" not in s.name
        ]

    assert itl_samples(batched) == itl_samples(one_by_one)


def test_batcher_part_without_redis_is_only_redis_up() -> None:
    registry = CollectorRegistry()
    registry.register(BatcherCollector(None, None, now=0.0))
    samples = [
        s for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples
    ]
    assert [(s.name, s.value) for s in samples] == [("cbserve:redis_up", 0.0)]


def test_a_cells_kv_usage_counts_blocks_over_all_its_workers() -> None:
    empty = HistogramData(bounds=[], counts=[], count=0, sum=0.0)

    def worker(num_blocks: int, num_free_blocks: int) -> WorkerMetrics:
        return WorkerMetrics(
            num_blocks=num_blocks,
            num_free_blocks=num_free_blocks,
            num_running=1,
            step_time=empty,
            batch_size=empty,
            num_tokens=empty,
        )

    # 10 of 100 blocks and 0 of 300 in use: 10 / 400 for the cell, not the mean of the fractions (0.05).
    snapshot = MetricsSnapshot(
        updated_at=0.0, queue_time=empty, workers={"w0": worker(100, 90), "w1": worker(300, 300)}
    )
    readings = [
        CellReading("a", {"num_waiting": 2.0, "num_running": 1.0}, snapshot, "m"),
        CellReading("b", {}, None, "m"),  # no batcher of cell b has written: no series
    ]
    registry = CollectorRegistry()
    registry.register(CellCollector(readings))
    samples = [
        s for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples
    ]
    assert {(s.name, s.labels["cell"], s.value) for s in samples} == {
        ("vllm:num_requests_waiting", "a", 2.0),
        ("vllm:num_requests_running", "a", 1.0),
        ("vllm:kv_cache_usage_perc", "a", 10 / 400),
    }
    assert kv_cache_usage(None) == 0.0

    # A cell whose workers serve adapters also says which run and wait (vLLM's lora_requests_info).
    lora = msgspec.structs.replace(
        snapshot, max_lora=4, running_lora_adapters=["x", "y"], waiting_lora_adapters=["z"], updated_at=7.0
    )
    registry = CollectorRegistry()
    registry.register(CellCollector([CellReading("a", {"num_waiting": 1.0}, lora, "m")]))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    [info] = families["vllm:lora_requests_info"].samples
    assert info.value == 7.0 and info.labels == {
        "model_name": "m",
        "cell": "a",
        "max_lora": "4",
        "waiting_lora_adapters": "z",
        "running_lora_adapters": "x,y",
    }
