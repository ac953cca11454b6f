"""A killed worker's replacement takes the compiled forward from the cache its predecessor wrote, and
serves `generate`'s tokens: the stream the kill interrupted, and a request only it can serve
(docs/reliability.md, *A restarted worker serves within seconds*; benchmarks/pipeline/worker_restart.py
measures how soon).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import httpx

from benchmarks.gpu.gpu_parity import reference_greedy
from harness.load import fault_clients as fault
from harness.load.load_clients import completion_body
from harness.processes.services import Stack

PROMPTS = [list(range(5, 29)), list(range(40, 3, -3))]
MAX_TOKENS = 48
TOKENS_BEFORE_KILL = 4
COMPILED = "compiled the forward in"
LOADED = "loaded the compiled forward from cache"


def test_a_replacement_worker_loads_the_compiled_forward_and_resumes_the_stream(
    make_stack: Callable[[], Stack], tiny_model_dir: Path, tmp_path: Path
) -> None:
    worker_env = {"WORKER_COMPILE": "true", "WORKER_COMPILE_CACHE_DIR": str(tmp_path / "compile-cache")}
    stack = make_stack()
    stack.start_batcher(**fault.FAST_HEARTBEAT_ENV)
    stack.start_worker("worker0", **worker_env)
    stack.start_gateway()
    stack.wait_ready(num_workers=1, timeout=600)  # the first worker compiles the forward
    assert COMPILED in stack.log("worker0") and LOADED not in stack.log("worker0")

    token_ids: list[int] = []
    body = completion_body(PROMPTS[0], MAX_TOKENS, stream=True)
    with httpx.stream("POST", f"{stack.base_url}/v1/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[len("data: ") :])["choices"]:
                token_ids.extend(choice.get("token_ids") or [])
            if len(token_ids) >= TOKENS_BEFORE_KILL and "worker0" in stack.procs:
                victim = stack.procs.pop("worker0")
                victim.send_signal(signal.SIGKILL)
                victim.wait(timeout=10)
                stack.start_worker("worker1", **worker_env)  # from here on, only it can compute tokens

    assert "worker1" in stack.procs, "the stream ended before the kill"
    # worker0 is dead: the replacement computes this one (after a failover, if the batcher placed it
    # on worker0 before declaring it dead).
    alone = httpx.post(
        f"{stack.base_url}/v1/completions",
        json=completion_body(PROMPTS[1], MAX_TOKENS, stream=False),
        timeout=300,
    )
    assert alone.status_code == 200, alone.text
    expected = reference_greedy(tiny_model_dir, PROMPTS, MAX_TOKENS)
    assert [token_ids, alone.json()["choices"][0]["token_ids"]] == expected
    replacement = stack.log("worker1")
    assert LOADED in replacement and "compiling the forward" not in replacement, replacement
