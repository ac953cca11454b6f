"""Fault tests' clients and checks: stream many completions, fire a fault mid-generation, time the
pause, then check what the clients saw and what the token streams in Redis hold."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from benchmarks.gpu.gpu_parity import reference_greedy
from common import streams
from common.protocol import FIELD, InboxMessage, TokenEvent, decode_event, decode_inbox

FaultCases = tuple[list[list[int]], list[list[int]]]  # prompts, and generate's tokens for each
# Fast failure detection, so that a dead worker is noticed within about two seconds.
FAST_HEARTBEAT_ENV = {"BATCHER_HEARTBEAT_TIMEOUT_S": "1.5", "BATCHER_WORKER_CHECK_INTERVAL_S": "0.1"}
# And a short lease, so that a dead batcher is replaced within about a second.
FAST_TAKEOVER_ENV = {**FAST_HEARTBEAT_ENV, "BATCHER_LEASE_TTL_S": "1.0", "BATCHER_STANDBY_POLL_S": "0.05"}
WORKER_ENV = {"WORKER_HEARTBEAT_INTERVAL_S": "0.2"}
# The fault tests' load: greedy streams long enough that a fault lands mid-stream.
NUM_STREAMS = 8
MAX_TOKENS = 96
TOKENS_BEFORE_FAULT = 4  # every stream has this many tokens when the fault fires


@dataclass
class ClientStream:
    """What one SSE client saw: token ids, when each arrived, how it ended."""

    token_ids: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() per token
    finish_reason: str | None = None
    errors: list[Any] = field(default_factory=list)
    entry_ids: list[str] = field(default_factory=list)  # SSE `id:` of each event (token stream entry)


async def stream_completion(
    client: httpx.AsyncClient,
    prompt: list[int],
    max_tokens: int,
    seen: ClientStream,
    model: str | None = None,
) -> None:
    """`model`: a served model or LoRA adapter by name; None, the gateway's only model."""
    body = {
        **({} if model is None else {"model": model}),
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": True,
    }
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("id: "):
                seen.entry_ids.append(line[len("id: ") :])
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                seen.errors.append(chunk["error"])
                continue
            for choice in chunk["choices"]:
                ids = choice.get("token_ids") or []
                seen.token_ids.extend(ids)
                seen.arrivals.extend([time.monotonic()] * len(ids))
                seen.finish_reason = choice.get("finish_reason") or seen.finish_reason


async def run_with_fault(
    base_url: str,
    prompts: list[list[int]],
    max_tokens: int,
    tokens_before: int,
    fault: Callable[[], None],
    after_fault: Callable[[], None],
) -> tuple[list[ClientStream], float]:
    """Stream every prompt; fire `fault` once each stream has `tokens_before` tokens (none finished),
    then run `after_fault` in a thread while the streams go on. Returns what each client saw and
    when the fault fired."""
    seen = [ClientStream() for _ in prompts]
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(120.0)) as client:
        tasks = [
            asyncio.create_task(stream_completion(client, p, max_tokens, s))
            for p, s in zip(prompts, seen, strict=True)
        ]
        deadline = time.monotonic() + 60
        while not all(len(s.token_ids) >= tokens_before for s in seen):
            assert time.monotonic() < deadline, f"streams did not start: {[len(s.token_ids) for s in seen]}"
            assert not any(t.done() for t in tasks), "a stream ended before the fault"
            await asyncio.sleep(0.01)
        assert all(len(s.token_ids) < max_tokens for s in seen), "too late: a stream already finished"
        fault_at = time.monotonic()
        fault()
        await asyncio.to_thread(after_fault)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=90)
    return seen, fault_at


def run_fault(
    base_url: str, cases: FaultCases, fault: Callable[[], None], after_fault: Callable[[], None]
) -> tuple[list[ClientStream], float]:
    """`run_with_fault` at the fault tests' load: the cases' prompts, MAX_TOKENS each, the fault once
    every stream has TOKENS_BEFORE_FAULT."""
    prompts, _ = cases
    return asyncio.run(run_with_fault(base_url, prompts, MAX_TOKENS, TOKENS_BEFORE_FAULT, fault, after_fault))


def check_cases(redis_url: str, cases: FaultCases, seen: list[ClientStream]) -> None:
    """After `run_fault`: each client got exactly `generate`'s tokens (no error, gap or repeat), and
    each raw token stream holds every index exactly once."""
    prompts, expected = cases
    check_clients(seen, expected)
    check_written_once(redis_url, len(prompts), MAX_TOKENS)


def longest_wait(seen: list[ClientStream], fault_at: float) -> float:
    """The longest any client waited for its next token across the fault: what a user notices."""
    return max(b - a for s in seen for a, b in zip(s.arrivals, s.arrivals[1:], strict=False) if b > fault_at)


def random_cases(model_dir: Path, seed: int, num_streams: int, max_tokens: int) -> FaultCases:
    """`num_streams` random prompts of 3 to 39 tokens, and `generate`'s greedy continuation of each."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(3, 40))] for _ in range(num_streams)]
    return prompts, reference_greedy(model_dir, prompts, max_tokens)


def cases_fixture(seed: int, num_streams: int = NUM_STREAMS, max_tokens: int = MAX_TOKENS) -> Any:
    """A module-scoped `cases` fixture: `random_cases` of the tiny model under `seed`. A module assigns
    it: `cases = fault.cases_fixture(11)`."""

    @pytest.fixture(scope="module")
    def cases(tiny_model_dir: Path) -> FaultCases:
        return random_cases(tiny_model_dir, seed, num_streams, max_tokens)

    return cases


def check_clients(seen: list[ClientStream], expected: list[list[int]]) -> None:
    """Every client got exactly `generate`'s tokens (none repeated, none missing) and no error."""
    for i, s in enumerate(seen):
        assert not s.errors, f"stream {i} got errors: {s.errors}"
        assert s.finish_reason == "length", f"stream {i} ended with {s.finish_reason}"
        assert s.token_ids == expected[i], (
            f"stream {i} differs from generate: {_first_difference(s.token_ids, expected[i])}"
        )


def _first_difference(got: list[int], want: list[int]) -> str:
    """Where a client's tokens leave `generate`'s, with a few on either side (a repeat, a gap or
    another token read differently)."""
    pairs = enumerate(zip(got, want, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(got), len(want)))
    around = slice(max(at - 3, 0), at + 5)
    return f"at index {at} of {len(got)} (generate: {len(want)}): got {got[around]}, generate {want[around]}"


def raw_token_events(
    redis_url: str | redis.Redis, skip: Collection[str] = (), cell: str = streams.DEFAULT_CELL
) -> list[list[TokenEvent]]:
    """Every event of every request's raw token stream in Redis (but the `skip` req_ids'), in stream
    order, the streams sorted by key: not what readers filter, what was written. `redis_url` may be
    a client of one node (a cluster's master serving a cell's slot)."""
    client = redis.Redis.from_url(redis_url) if isinstance(redis_url, str) else redis_url
    skipped = {streams.token_stream(req_id) for req_id in skip}
    pattern = streams.token_stream(streams.placed_req_id(cell, "*"))
    keys = sorted(k.decode() for k in client.scan_iter(match=pattern))  # type: ignore[union-attr]
    out = []
    for key in (k for k in keys if k not in skipped):
        entries: Any = client.xrange(key)
        events = [decode_event(fields[FIELD]) for _, fields in entries]
        assert all(isinstance(e, TokenEvent) for e in events), events
        out.append([e for e in events if isinstance(e, TokenEvent)])
    return out


def check_one_token_per_index(events: list[TokenEvent], max_tokens: int) -> None:
    """A raw token stream holds every index, each with one token, attempts never going back. A
    publish whose reply was lost in an outage may be repeated (same index, same token)."""
    by_index: dict[int, set[int]] = {}
    for e in events:
        by_index.setdefault(e.index, set()).add(e.token_id)
    assert sorted(by_index) == list(range(max_tokens)), sorted(by_index)
    assert all(len(tokens) == 1 for tokens in by_index.values()), by_index
    attempts = [e.attempt for e in events]
    assert attempts == sorted(attempts), attempts


def check_written_once(redis_url: str, num_streams: int, max_tokens: int) -> None:
    """Not just filtered by readers: each index of each raw token stream was written exactly once,
    by one attempt at a time."""
    token_streams = raw_token_events(redis_url)
    assert len(token_streams) == num_streams
    for events in token_streams:
        assert [e.index for e in events] == list(range(max_tokens)), [(e.index, e.attempt) for e in events]
        attempts = [e.attempt for e in events]
        assert attempts == sorted(attempts), attempts


def inbox_messages(redis_url: str) -> list[InboxMessage]:
    """Everything in the batcher's inbox so far (results, aborts, worker hellos), oldest first."""
    entries: Any = redis.Redis.from_url(redis_url).xrange(streams.BATCHER_INBOX)
    return [decode_inbox(fields[FIELD]) for _, fields in entries]
