"""Workers come and go: one that announces itself while requests run joins the batch at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from harness.processes.services import Stack, wait_for


async def _generate(base_url: str, prompts: list[list[int]], max_tokens: int) -> list[dict[str, object]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        bodies = [
            {"prompt": p, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True} for p in prompts
        ]
        responses = await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    return [r.json() for r in responses]


def test_late_worker_joins_and_takes_new_requests(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack().start_all()
    first = [[10 + i, 20 + i, 30 + i] for i in range(4)]
    assert all(r["usage"]["completion_tokens"] == 8 for r in asyncio.run(_generate(stack.base_url, first, 8)))  # type: ignore[index]

    stack.start_worker("worker1")
    wait_for(lambda: stack.num_workers_joined() == 2, 90, "the second worker to join")
    # Worker 1 has every block free, so the next requests go to it before worker 0 gets its share.
    second = [[40 + i, 50 + i] for i in range(8)]
    asyncio.run(_generate(stack.base_url, second, 8))
    steps = {k: v for k, v in stack.stats().items() if k.startswith("num_steps:")}
    assert len(steps) == 2 and all(n > 0 for n in steps.values()), steps
    assert stack.stats_after(12)["num_finished"] == 12
