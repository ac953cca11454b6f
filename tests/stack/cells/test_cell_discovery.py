"""GATEWAY_CELLS=*: a gateway places requests in the cells whose batchers registered lately.

A real stack on one Redis: cell a serves alone; cell b started at run time takes requests within
seconds; once b's batcher is killed, b stops receiving them while a keeps serving.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import httpx
import redis

from common.streams import CELLS_REGISTRY, cell_of
from gateway.cell_router import LIVE_WITHIN_S, REFRESH_S
from harness.processes.services import Stack, wait_for


def _cell_of_next(client: httpx.Client) -> str:
    """The cell a one-token greedy completion ran in."""
    body = {"prompt": [5, 6, 7], "max_tokens": 1, "temperature": 0}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return cell_of(response.json()["id"].removeprefix("cmpl-"))


def test_cells_that_register_take_traffic_and_gone_ones_stop(make_stack: Callable[[], Stack]) -> None:
    stack = make_stack()
    stack.start_batcher("batcher-a", CBSERVE_CELL="a")
    stack.start_worker("worker-a", CBSERVE_CELL="a")
    # least_load: idle cells take turns, so a new cell is placed in as soon as the gateway knows it.
    stack.start_gateway(GATEWAY_CELLS="*", CBSERVE_CELL="a", GATEWAY_CELL_POLICY="least_load")
    stack.wait_ready(num_workers=0, timeout=240)
    wait_for(lambda: stack.num_workers_joined("a") == 1, 240, "cell a's worker to join")

    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        assert {_cell_of_next(client) for _ in range(3)} == {"a"}

        batcher_b = stack.start_batcher("batcher-b", CBSERVE_CELL="b")
        stack.start_worker("worker-b", CBSERVE_CELL="b")
        wait_for(lambda: stack.num_workers_joined("b") == 1, 240, "cell b's worker to join")
        # Registered with its first stats; the gateway reads the registry again within REFRESH_S.
        wait_for(lambda: _cell_of_next(client) == "b", 10 * REFRESH_S + 30, "a request placed in cell b")
        metrics = client.get("/metrics").text.splitlines()
        assert any(m.startswith("vllm:num_requests_waiting{") and 'cell="b"' in m for m in metrics), metrics

        batcher_b.send_signal(signal.SIGKILL)
        batcher_b.wait()
        # Nothing is sent meanwhile: a request placed in b now would wait there for a batcher.
        with redis.Redis.from_url(stack.redis_url) as r:

            def b_aged_out() -> bool:
                score = r.zscore(CELLS_REGISTRY, "b")
                return score is not None and time.time() - float(score) > LIVE_WITHIN_S + REFRESH_S

            wait_for(b_aged_out, LIVE_WITHIN_S + 30, "cell b's registration to age out")
        assert {_cell_of_next(client) for _ in range(4)} == {"a"}
