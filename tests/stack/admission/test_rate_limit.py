"""Per-key RPM / TPM limits, counted in Redis: 429 with Retry-After, refused requests not counted or
queued, limits shared by every gateway on the same Redis."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from common.streams import rate_limit_key
from gateway.limits.rate_limit import WINDOW_S
from gateway.security.api_keys import hash_key
from harness.gateway.gateway_server import RunningGateway
from harness.gateway.responder import Responder, responding

KEYS = f"alice:{hash_key('sk-alice')},bob:{hash_key('sk-bob')}"
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}


def _body(max_tokens: int = 2, **extra: Any) -> dict[str, Any]:
    return {"prompt": "hi", "max_tokens": max_tokens, **extra}


@pytest.fixture()
def responder(redis_url: str) -> Iterator[Responder]:
    """Answers every request."""
    with responding(redis_url) as r:
        yield r


@pytest.fixture()
def make_gateway(make_gateway: Callable[..., RunningGateway]) -> Callable[..., RunningGateway]:
    """Gateways whose rate limiter's clock stands still, at one instant for all of them: no test
    straddles two windows (Redis's clock, which they otherwise follow, would end one every minute)."""
    now = time.time()

    def make(**overrides: Any) -> RunningGateway:
        gateway = make_gateway(**overrides)
        gateway.app.state.gateway.rate_limiter.clock = lambda: now
        return gateway

    return make


def _assert_429(response: httpx.Response, kind: str, retry_after: bool = True) -> dict[str, Any]:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "rate_limit_exceeded" and error["type"] == kind
    if retry_after:
        assert 1 <= int(response.headers["retry-after"]) <= WINDOW_S
    else:
        assert "retry-after" not in response.headers
    return dict(error)


def test_requests_per_minute(make_gateway: Callable[..., RunningGateway], responder: Responder) -> None:
    gateway = make_gateway(api_key_hashes=KEYS, rate_limit_rpm=2)
    for _ in range(2):
        assert gateway.client.post("/v1/completions", json=_body(), headers=ALICE).status_code == 200
    message = _assert_429(gateway.client.post("/v1/completions", json=_body(), headers=ALICE), "requests")
    assert "Limit 2" in message["message"]
    # The refused request was neither queued nor counted; another key has its own budget.
    assert gateway.harness.num_requests() == 2
    counters = gateway.harness.redis.hgetall(rate_limit_key("alice"))
    assert int(counters[b"r"]) == 2
    assert gateway.client.post("/v1/completions", json=_body(), headers=BOB).status_code == 200


def test_tokens_per_minute_count_prompt_and_every_choice(
    make_gateway: Callable[..., RunningGateway], responder: Responder
) -> None:
    gateway = make_gateway(api_key_hashes=KEYS, rate_limit_tpm=100)
    ok = gateway.client.post("/v1/completions", json=_body(max_tokens=20, n=2), headers=ALICE)
    assert ok.status_code == 200, ok.text
    prompt_tokens = ok.json()["usage"]["prompt_tokens"]
    used = prompt_tokens + 2 * 20
    counters = gateway.harness.redis.hgetall(rate_limit_key("alice"))
    assert int(counters[b"t"]) == used
    # What is left fits exactly; one token more does not.
    left = 100 - used - prompt_tokens
    over = gateway.client.post("/v1/completions", json=_body(max_tokens=left + 1), headers=ALICE)
    assert f"Requested {prompt_tokens + left + 1}" in _assert_429(over, "tokens")["message"]
    exact = gateway.client.post("/v1/completions", json=_body(max_tokens=left), headers=ALICE)
    assert exact.status_code == 200, exact.text
    _assert_429(gateway.client.post("/v1/completions", json=_body(max_tokens=1), headers=ALICE), "tokens")


def test_a_request_larger_than_the_limit_is_told_not_to_retry(
    make_gateway: Callable[..., RunningGateway], responder: Responder
) -> None:
    gateway = make_gateway(api_key_hashes=KEYS, rate_limit_tpm=10)
    response = gateway.client.post("/v1/completions", json=_body(max_tokens=50), headers=ALICE)
    assert "too large" in _assert_429(response, "tokens", retry_after=False)["message"]
    assert gateway.harness.redis.dbsize() == 1  # the responder's heartbeat only


def test_invalid_requests_do_not_count(
    make_gateway: Callable[..., RunningGateway], responder: Responder
) -> None:
    gateway = make_gateway(api_key_hashes=KEYS, rate_limit_rpm=1)
    bad = gateway.client.post("/v1/completions", json=_body(temperature=9), headers=ALICE)
    assert bad.status_code == 400
    assert gateway.client.post("/v1/completions", json=_body(), headers=ALICE).status_code == 200


def test_limits_are_shared_by_gateways(
    make_gateway: Callable[..., RunningGateway], responder: Responder
) -> None:
    first = make_gateway(api_key_hashes=KEYS, rate_limit_rpm=3)
    second = make_gateway(api_key_hashes=KEYS, rate_limit_rpm=3)
    assert first.client.post("/v1/completions", json=_body(), headers=ALICE).status_code == 200
    assert second.client.post("/v1/completions", json=_body(), headers=ALICE).status_code == 200
    assert first.client.post("/v1/completions", json=_body(), headers=ALICE).status_code == 200
    _assert_429(second.client.post("/v1/completions", json=_body(), headers=ALICE), "requests")
    _assert_429(first.client.post("/v1/completions", json=_body(), headers=ALICE), "requests")


def test_without_keys_everyone_shares_one_budget(
    make_gateway: Callable[..., RunningGateway], responder: Responder
) -> None:
    gateway = make_gateway(rate_limit_rpm=1)
    assert gateway.client.post("/v1/completions", json=_body()).status_code == 200
    _assert_429(gateway.client.post("/v1/completions", json=_body()), "requests")
    assert gateway.harness.redis.ttl(rate_limit_key("")) > 0  # counters expire on their own


def test_each_end_user_of_a_key_has_its_own_limit_within_the_keys(
    make_gateway: Callable[..., RunningGateway], responder: Responder
) -> None:
    """safety_identifier (or user) is the tenant: one end user's burst leaves the others their share."""
    gateway = make_gateway(api_key_hashes=KEYS, rate_limit_rpm=3, rate_limit_user_rpm=1)
    post = gateway.client.post
    assert post("/v1/completions", json=_body(safety_identifier="u1"), headers=ALICE).status_code == 200
    error = _assert_429(
        post("/v1/completions", json=_body(safety_identifier="u1"), headers=ALICE), "requests"
    )
    assert "end user 'u1'" in error["message"]
    # Another end user, named either way, has its own minute; the key's own limit still holds over all.
    assert post("/v1/completions", json=_body(user="u2"), headers=ALICE).status_code == 200
    assert post("/v1/completions", json=_body(safety_identifier="u3"), headers=ALICE).status_code == 200
    error = _assert_429(
        post("/v1/completions", json=_body(safety_identifier="u4"), headers=ALICE), "requests"
    )
    assert "end user" not in error["message"]
    # Bob's u1 is not Alice's.
    assert post("/v1/completions", json=_body(safety_identifier="u1"), headers=BOB).status_code == 200
