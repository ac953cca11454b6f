"""Fuzz the HTTP API from its own OpenAPI schema (schemathesis): no input may produce a 5xx.

A real gateway (uvicorn, over HTTP) with API keys on, on a real Redis, with a stand-in worker that
finishes every request, so accepted requests complete quickly. Both schema-conforming and
schema-violating bodies are generated; the example count is bounded to keep the test short.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import requests

hypothesis = pytest.importorskip("hypothesis")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from gateway.security.api_keys import hash_key  # noqa: E402
from harness.gateway.gateway_server import RunningGateway  # noqa: E402
from harness.gateway.responder import responding  # noqa: E402

KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {KEY}"}
EXAMPLES_PER_OPERATION = 100


def _fuzz_operation(operation: Any, mode: Any, base_url: str, session: requests.Session) -> None:
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        derandomize=True,  # the same examples every run: a failure here is reproducible
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call(base_url=base_url, session=session, headers=AUTH, timeout=30)
        assert response.status_code < 500, (
            f"{case.method} {case.path} -> {response.status_code}: {response.text[:500]}\nbody: {case.body!r}"
        )

    run()


def test_no_input_gets_a_server_error(make_gateway: Callable[..., RunningGateway], redis_url: str) -> None:
    # The stand-in worker reads the requests stream without a batcher's claim, so every request it
    # answered still counts as waiting: the queue bound is lifted above what the fuzzer sends.
    gateway = make_gateway(
        api_key_hashes=f"fuzzer:{hash_key(KEY)}", max_tokens=8, max_queued_requests=100_000
    )
    spec = gateway.client.get("/openapi.json", headers=AUTH).json()
    schema = schemathesis.openapi.from_dict(spec)
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    with responding(redis_url) as responder, requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            # An operation without a body (a GET, a cancel by id) has no invalid input to generate.
            has_body = bool(operation.get_request_payload_content_types())
            for mode in modes if has_body else modes[:1]:
                _fuzz_operation(operation, mode, gateway.url, session)
        # The fuzzer got past validation too, not only into 4xx answers (most random sampling values
        # are out of range, so only a few get through).
        assert responder.requests, "no generated request was accepted"
        # Still serving, and still refusing what it should.
        ok = session.post(
            f"{gateway.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=AUTH, timeout=30
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["usage"]["completion_tokens"] == 2
        assert session.get(f"{gateway.url}/v1/models", timeout=30).status_code == 401
