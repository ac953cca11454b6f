"""Cache-aware cell placement through a real stack: two cells (a batcher and a worker each) behind one
gateway on one Redis. Prompts sharing a prefix all go to the cell that was sent it first, and are
served from that cell's prefix cache; unrelated prompts sent together still spread over both cells.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import httpx

from common.streams import cell_of
from harness.processes.services import Stack, wait_for

CELLS = ("a", "b")
SHARED = [(7 * i) % 400 + 3 for i in range(64)]  # 4 blocks of 16 tokens: a shared system prompt


def _completion(client: httpx.Client, prompt: list[int], max_tokens: int = 2) -> tuple[str, int]:
    """The cell a completion ran in, and its prompt tokens served from the cell's cache."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    reply = response.json()
    cached = (reply["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return cell_of(reply["id"].removeprefix("cmpl-")), int(cached)


def _load(stack: Stack, cell: str) -> float:
    """Requests waiting and running in the cell, as its batcher last published them."""
    stats = stack.stats(cell)
    return stats.get("num_waiting", 1) + stats.get("num_running", 1)


async def _together(base_url: str, prompts: list[list[int]]) -> list[str]:
    """The cells of `prompts` sent all at once."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:

        async def one(prompt: list[int]) -> str:
            body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
            response = await client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            return cell_of(response.json()["id"].removeprefix("cmpl-"))

        return list(await asyncio.gather(*(one(p) for p in prompts)))


def test_a_shared_prefix_stays_in_one_cell_while_unrelated_load_spreads(
    make_stack: Callable[[], Stack],
) -> None:
    stack = make_stack()
    for cell in CELLS:
        stack.start_batcher(f"batcher-{cell}", CBSERVE_CELL=cell)
        stack.start_worker(f"worker-{cell}", CBSERVE_CELL=cell)
    stack.start_gateway(GATEWAY_CELLS="a,b", CBSERVE_CELL="a", GATEWAY_CELL_POLICY="cache_aware")
    stack.wait_ready(num_workers=0, timeout=240)
    for cell in CELLS:
        wait_for(lambda c=cell: stack.num_workers_joined(c) == 1, 240, f"cell {cell}'s worker to join")  # type: ignore[misc]

    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        # One at a time, so both cells are idle each time: load alone would take turns.
        shared = [_completion(client, SHARED + [100 + i] * 16) for i in range(5)]
        home = shared[0][0]
        assert [cell for cell, _ in shared] == [home] * 5, shared
        assert all(cached >= len(SHARED) for _, cached in shared[1:]), shared  # its cell kept them

        spread = asyncio.run(_together(stack.base_url, [[200 + i] * 48 for i in range(8)]))
        assert set(Counter(spread)) == set(CELLS), spread

        # Once the burst is over (as each batcher's stats say), the prefix's home has not moved.
        for cell in CELLS:
            wait_for(lambda c=cell: _load(stack, c) == 0, 30, f"cell {cell} to report its burst done")  # type: ignore[misc]
        assert _completion(client, SHARED + [300] * 16)[0] == home
