"""A worker SIGKILLed mid-stream, with the streams read by the real OpenAI SDK: every stream goes on.

test_fault_worker.py reads its streams line by line with httpx; an SDK is stricter about what it
parses. openai 3.63's SSE decoder keeps the last event id, so a keep-alive followed by a blank line
dispatched an event with empty data and its `Stream` raised `JSONDecodeError`: streams whose next
token was more than GATEWAY_SSE_KEEPALIVE_S away died in the client, which is what a killed worker's
streams do while the batcher waits out the heartbeat timeout (6 of 16 SDK streams failed so).

Here the keep-alive interval is short and the heartbeat timeout several of them long, so that every
stream the killed worker served reads keep-alives mid-stream (the raw bytes the SDK read say so), and
each must still end with exactly `generate`'s tokens and no SDK exception.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import httpx2 as httpx  # the HTTP library the SDK is built on
import openai

from harness.load import fault_clients as fault
from harness.processes.services import Stack, wait_for
from tests.stack.streams.test_sse_sdk_pause import KEEPALIVE, RecordingTransport

NUM_STREAMS = 16
KEEPALIVE_S = 0.5
HEARTBEAT_TIMEOUT_S = 3.0  # detection takes several keep-alive intervals
BATCHER_ENV = {
    "BATCHER_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
    "BATCHER_WORKER_CHECK_INTERVAL_S": "0.1",
}
GATEWAY_ENV = {"GATEWAY_SSE_KEEPALIVE_S": str(KEEPALIVE_S)}
WAIT_S = 90.0

cases = fault.cases_fixture(29, num_streams=NUM_STREAMS)


class BodyTransport(RecordingTransport):
    """RecordingTransport (one per client, so one stream's bytes) that hands back what it recorded."""

    def body(self) -> bytes:
        with self._lock:
            return self._body


@dataclass
class SdkStream:
    """One SDK client's stream: what it parsed (`seen`), the raw bytes under it and its request id."""

    transport: BodyTransport = field(default_factory=BodyTransport)
    seen: fault.ClientStream = field(default_factory=fault.ClientStream)
    req_id: str = ""

    def tokens_before_keepalives(self) -> list[int]:
        """For each keep-alive the SDK read, how many tokens the stream had carried before it."""
        counts: list[int] = []
        num_tokens = 0
        for line in self.transport.body().split(b"\n"):
            if line.startswith(KEEPALIVE):
                counts.append(num_tokens)
            elif line.startswith(b"data: {"):
                chunk = json.loads(line[len(b"data: ") :])
                num_tokens += sum(len(c.get("token_ids") or []) for c in chunk.get("choices", []))
        return counts


def _read(stack: Stack, model: str, prompt: list[int], stream: SdkStream) -> None:
    """Streams one greedy completion with the SDK to its end; an SDK exception is noted, not raised."""
    http = httpx.Client(transport=stream.transport, timeout=WAIT_S)
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", http_client=http, max_retries=0)
    seen = stream.seen
    try:
        raw = client.completions.with_raw_response.create(
            model=model,
            prompt=prompt,
            max_tokens=fault.MAX_TOKENS,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        stream.req_id = raw.headers["x-request-id"]
        for chunk in raw.parse():
            for choice in chunk.choices:
                ids = (choice.model_extra or {}).get("token_ids") or []
                seen.token_ids.extend(ids)
                seen.arrivals.extend([time.monotonic()] * len(ids))
                seen.finish_reason = choice.finish_reason or seen.finish_reason
    except Exception as exc:  # what the test is about: any SDK failure fails it, with its reason
        seen.errors.append(repr(exc))
    finally:
        client.close()


def _num_tokens(streams: list[SdkStream]) -> list[int]:
    return [len(s.seen.token_ids) for s in streams]


def _wait_all(futures: list[Future[None]], streams: list[SdkStream]) -> None:
    done, pending = wait(futures, timeout=WAIT_S)
    assert not pending, f"streams still open: {_num_tokens(streams)}"
    for f in done:
        f.result()


def test_sdk_streams_of_a_killed_worker_read_to_the_end(
    make_stack: Callable[[], Stack], cases: fault.FaultCases
) -> None:
    stack = make_stack().start_all(
        2, batcher_env=BATCHER_ENV, worker_env=fault.WORKER_ENV, gateway_env=GATEWAY_ENV
    )
    with stack.sdk() as sdk:
        model = sdk.models.list().data[0].id
    victim = stack.procs["worker1"]
    prompts, _ = cases
    streams = [SdkStream() for _ in prompts]

    with ThreadPoolExecutor(max_workers=NUM_STREAMS) as pool:
        futures = [pool.submit(_read, stack, model, p, s) for p, s in zip(prompts, streams, strict=True)]
        deadline = time.monotonic() + WAIT_S
        while not all(len(s.seen.token_ids) >= fault.TOKENS_BEFORE_FAULT for s in streams):
            assert time.monotonic() < deadline, f"streams did not start: {_num_tokens(streams)}"
            assert not any(f.done() for f in futures), [s.seen.errors for s in streams]
            time.sleep(0.01)
        assert all(len(s.seen.token_ids) < fault.MAX_TOKENS for s in streams), "too late: one finished"
        fault_at = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        wait_for(lambda: stack.stats().get("num_workers_lost", 0) >= 1, 30, "the batcher to notice the kill")
        _wait_all(futures, streams)
    victim.wait(timeout=10)
    del stack.procs["worker1"]  # expected dead; the stack's liveness checks must not trip on it

    fault.check_cases(stack.redis_url, cases, [s.seen for s in streams])
    stats = stack.stats_after(NUM_STREAMS)
    assert stats["num_finished"] == NUM_STREAMS and stats["num_failed"] == 0, stats

    # The killed worker's requests: those whose raw token stream a second attempt finished.
    attempts: dict[str, set[int]] = {}
    for events in fault.raw_token_events(stack.redis_url):
        for e in events:
            attempts.setdefault(e.req_id, set()).add(e.attempt)
    moved = [s for s in streams if len(attempts[s.req_id]) > 1]
    assert moved and len(moved) == stats["num_failovers"], (len(moved), stats)
    for s in moved:
        counts = s.tokens_before_keepalives()
        assert any(0 < n < fault.MAX_TOKENS for n in counts), (
            f"no keep-alive reached {s.req_id} mid-stream: {counts}"
        )
    wait_s = fault.longest_wait([s.seen for s in moved], fault_at)
    print(
        f"\nSIGKILL of 1 of 2 workers, {len(moved)} of {NUM_STREAMS} SDK streams moved: longest client "
        f"wait {wait_s:.2f}s, keep-alives mid-stream {[s.tokens_before_keepalives() for s in moved]}"
    )
    assert wait_s > 2 * KEEPALIVE_S  # a real pause, more than the keep-alive interval
