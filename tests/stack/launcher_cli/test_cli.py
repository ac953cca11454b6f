"""`python -m gateway` as an operator runs it: flags over env, health, then a request end to end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from harness.gateway.stream_harness import StreamHarness
from harness.processes.redis_server import free_port

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture()
def gateway_process(redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "MODEL": "/nonexistent/overridden/by/the/flag",
        "GATEWAY_SERVED_MODEL_NAME": "overridden-too",
        "GATEWAY_HEARTBEAT_TIMEOUT_S": "30",
    }
    cmd = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--log-level", "warning"]
    log_path = tmp_path / "gateway.log"
    log = log_path.open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                httpx.get(f"{url}/v1/models", timeout=5)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise RuntimeError(f"gateway did not come up:\n{log_path.read_text()}") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_cli_serves(gateway_process: str, redis_url: str) -> None:
    url = gateway_process
    harness = StreamHarness(redis_url)
    try:
        assert httpx.get(f"{url}/health").status_code == 503
        # A heartbeat 20 s old counts: GATEWAY_HEARTBEAT_TIMEOUT_S=30 was read from the environment.
        harness.heartbeat(at=time.time() - 20)
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny"
        with ThreadPoolExecutor(max_workers=1) as pool:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            future = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=30)
            request = harness.next_request()
            harness.emit_tokens(request.req_id, [300, 301, 302], finish_reason="length")
            response = future.result(timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "tiny"
    finally:
        harness.close()
