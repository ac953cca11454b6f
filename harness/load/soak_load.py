"""Sustained load with random disconnects, for `scripts/soak.py` and its short CI variant.

Requests arrive at a steady rate, each a random kind:
- `stream` / `complete`: read whole (streaming SSE / one JSON body);
- `stream_resume`: ask for `resumable`, hang up after a few tokens, then resume within the grace window with
  `GET /v1/requests/{id}/stream` and `Last-Event-ID`: what was read plus the rest must be whole;
- `stream_abandon`: hang up and never come back (not resumable: the gateway aborts it at once);
- `complete_abandon`: a non-streaming client that gives up before the answer (aborted at once).

Every request is greedy with `ignore_eos` and a random `max_tokens`, so a whole answer has exactly
that many token ids. The caller then checks that nothing is left behind.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness.load.load_clients import Outcome, complete, complete_and_leave, completion_body, resume, stream

KINDS = ("stream", "complete", "stream_resume", "stream_abandon", "complete_abandon")
DEFAULT_MIX = (0.4, 0.25, 0.15, 0.1, 0.1)


@dataclass
class SoakReport:
    submitted: Counter[str] = field(default_factory=Counter)
    whole: Counter[str] = field(default_factory=Counter)  # answers checked whole (kinds that finish)
    left: Counter[str] = field(default_factory=Counter)  # clients that hung up as planned
    failures: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0  # token ids received in whole answers

    def fail(self, kind: str, why: str, out: Outcome | None = None) -> None:
        detail: dict[str, Any] = {"kind": kind, "why": why}
        if out is not None:
            detail.update(
                status=out.status, req_id=out.req_id, tokens=len(out.token_ids), errors=out.errors[:1]
            )
            detail.update(finish_reason=out.finish_reason, done=out.done)
        self.failures.append(detail)

    def summary(self) -> dict[str, Any]:
        return {
            "submitted": dict(self.submitted),
            "whole": dict(self.whole),
            "left_as_planned": dict(self.left),
            "failures": len(self.failures),
            "failure_examples": self.failures[:5],
            "tokens_in_whole_answers": self.tokens,
        }


@dataclass(frozen=True)
class Plan:
    kind: str
    prompt: list[int]
    max_tokens: int
    hang_up_after: int  # tokens (streams) before the client leaves
    wait_s: float  # resume delay, or how long a non-streaming client waits before leaving


async def _one(client: httpx.AsyncClient, plan: Plan, report: SoakReport) -> None:
    streaming = plan.kind.startswith("stream")
    body = completion_body(plan.prompt, plan.max_tokens, stream=streaming)
    if plan.kind == "stream_resume":
        body["resumable"] = True  # only a request that asks for it outlives its connection
    if plan.kind in ("stream", "complete"):
        out = await (stream(client, body) if streaming else complete(client, body))
        _check_whole(report, plan, out)
    elif plan.kind == "complete_abandon":
        out = await complete_and_leave(client, body, plan.wait_s)
        report.left[plan.kind] += out.left_at is not None  # else it finished first: fine too
    else:
        out = await stream(client, body, hang_up_after=plan.hang_up_after)
        if out.left_at is None:  # it ended before the client meant to leave
            _check_whole(report, plan, out)
            return
        report.left[plan.kind] += 1
        if plan.kind == "stream_resume":
            await asyncio.sleep(plan.wait_s)
            rest = await resume(client, out)
            rest.token_ids = out.token_ids + rest.token_ids
            # It may have left after the last token event, before `[DONE]`: then the rest is only that.
            rest.finish_reason = rest.finish_reason or out.finish_reason
            _check_whole(report, plan, rest)


def _check_whole(report: SoakReport, plan: Plan, out: Outcome) -> None:
    if out.is_whole(plan.max_tokens):
        report.whole[plan.kind] += 1
        report.tokens += len(out.token_ids)
    else:
        report.fail(plan.kind, f"not whole (want {plan.max_tokens} tokens)", out)


def plan_request(rng: random.Random, mix: tuple[float, ...], grace_s: float) -> Plan:
    kind = rng.choices(KINDS, weights=mix)[0]
    # Abandoned requests are long, so that they are still running when their abort comes.
    max_tokens = rng.randrange(200, 401) if kind.endswith("abandon") else rng.randrange(8, 65)
    return Plan(
        kind=kind,
        prompt=[rng.randrange(3, 500) for _ in range(rng.randrange(4, 24))],
        max_tokens=max_tokens,
        hang_up_after=rng.randrange(1, max_tokens // 2 + 1),
        wait_s=rng.uniform(0.0, grace_s / 2) if kind == "stream_resume" else rng.uniform(0.01, 0.3),
    )


async def soak(
    base_url: str,
    duration_s: float,
    rate: float,
    grace_s: float,
    *,
    seed: int = 0,
    mix: tuple[float, ...] = DEFAULT_MIX,
) -> SoakReport:
    """Start `rate` requests a second for `duration_s`, then wait for every client to end."""
    rng = random.Random(seed)
    report = SoakReport()
    tasks: set[asyncio.Task[None]] = set()

    async def guarded(plan: Plan) -> None:
        try:
            await _one(client, plan, report)
        except (httpx.HTTPError, AssertionError) as exc:
            report.fail(plan.kind, repr(exc))

    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(120.0), limits=limits) as client:
        start = time.monotonic()
        num_started = 0
        while (now := time.monotonic() - start) < duration_s:
            # Catch up on the schedule: arrivals stay at `rate` however long a loop turn took.
            while num_started < now * rate:
                plan = plan_request(rng, mix, grace_s)
                report.submitted[plan.kind] += 1
                task = asyncio.create_task(guarded(plan))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                num_started += 1
            await asyncio.sleep(min(0.05, 1 / rate))
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
    return report
