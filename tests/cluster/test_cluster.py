"""The whole stack on a real Redis Cluster (3 masters, 3 replicas): greedy output equals `generate`,
streams resume by id, and no command of any service spans slots (no CROSSSLOT error on any node).

Real processes (batcher, worker, gateway) with REDIS_CLUSTER=true and every node in REDIS_URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from benchmarks.gpu.gpu_parity import reference_greedy
from common import streams
from harness.gateway.sse_client import get_sse, post_sse, read_then_hang_up
from harness.load.load_clients import completion_body
from harness.processes.redis_cluster import RedisCluster, assert_no_crossslot
from harness.processes.services import Stack, cluster_stack

PROMPTS = [[72, 101, 108, 108, 111], [5, 9, 13, 21, 34, 55, 89, 7], [40, 41, 42]]
MAX_TOKENS = [12, 20, 30]


@pytest.fixture(scope="module")
def stack(
    cluster: RedisCluster, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with cluster_stack(cluster.url, tiny_model_dir, tmp_path_factory.mktemp("cluster-stack")) as stack:
        stack.start_batcher()
        stack.start_worker()
        stack.start_gateway(GATEWAY_RESUME_GRACE_S="30")
        stack.wait_ready(num_workers=1, timeout=240)  # seven processes and a cluster on a shared machine
        yield stack


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> list[list[int]]:
    return reference_greedy(tiny_model_dir, PROMPTS, MAX_TOKENS)


def _streamed_ids(events: list[Any]) -> list[int]:
    chunks = [e.json() for e in events if e.data != "[DONE]"]
    return [t for c in chunks for choice in c["choices"] for t in choice.get("token_ids") or []]


def test_greedy_output_equals_generate_on_a_cluster(
    stack: Stack, cluster: RedisCluster, reference: list[list[int]]
) -> None:
    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        for prompt, max_tokens, expected in zip(PROMPTS, MAX_TOKENS, reference, strict=True):
            response = client.post("/v1/completions", json=completion_body(prompt, max_tokens, stream=False))
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["token_ids"] == expected
            _, events = post_sse(client, "/v1/completions", completion_body(prompt, max_tokens, stream=True))
            assert events[-1].data == "[DONE]"
            assert _streamed_ids(events) == expected
    assert_no_crossslot(cluster)


def test_a_dropped_stream_resumes_by_id_on_a_cluster(
    stack: Stack, cluster: RedisCluster, reference: list[list[int]]
) -> None:
    body = {**completion_body(PROMPTS[2], MAX_TOKENS[2], stream=True), "resumable": True}
    req_id, seen = read_then_hang_up(stack.base_url, "/v1/completions", body, 3)
    last_id = next(e.id for e in reversed(seen) if e.id is not None)
    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        response, rest = get_sse(client, f"/v1/requests/{req_id}/stream", {"Last-Event-ID": last_id})
    assert response.status_code == 200, response.text
    assert rest[-1].data == "[DONE]"
    assert _streamed_ids(seen) + _streamed_ids(rest) == reference[2]
    # The request's keys are in the default cell's slot, with the cell's own keys.
    with stack.redis() as client:
        assert client.exists(streams.token_stream(req_id))
        slot = client.cluster_keyslot(streams.token_stream(req_id))  # type: ignore[attr-defined]
        assert slot == client.cluster_keyslot(streams.cell_keys().requests)  # type: ignore[attr-defined]
    assert_no_crossslot(cluster)


def test_chat_with_n_choices_on_a_cluster(stack: Stack, cluster: RedisCluster) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "n": 2, "temperature": 0}
    with httpx.Client(base_url=stack.base_url, timeout=120) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == 2 and choices[0]["message"]["content"] == choices[1]["message"]["content"]
    assert_no_crossslot(cluster)


def test_the_check_sees_a_command_that_spans_slots(cluster: RedisCluster) -> None:
    node = cluster.nodes()[0]
    with pytest.raises(redis.ResponseError, match="same slot"):  # the CROSSSLOT error
        node.execute_command("MSET", "{a}x", "1", "{b}y", "2")  # both slots may live on other nodes
    with pytest.raises(AssertionError, match="CROSSSLOT"):
        assert_no_crossslot(cluster)
    for each in cluster.nodes():
        each.config_resetstat()  # the other tests check after their own commands
