"""Every 503 the gateway can answer carries Retry-After: the refusals of admission, the failures a
request placed in a cell ends with, Redis away or full, the Batch API's queue, /health.

Before, a request that failed with `no_batcher`, `queue_timeout` or `request_lost` after it was placed
was answered 503 without it, and so was /health's `no_worker`.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.exceptions
from starlette.requests import Request

from common.protocol import RequestError
from gateway.api.error_handlers import _http_error, _openai_error, _redis_error
from gateway.health import unavailable
from gateway.limits.cell_guard import no_batcher_error, redis_full_error
from openai_frontend.protocol.errors import _STATUS_BY_CODE, OpenAIError, from_request_error

CODES_503 = sorted(code for code, status in _STATUS_BY_CODE.items() if status == 503)


def _request(path: str = "/v1/chat/completions") -> Request:
    return Request({"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""})


def _retry_after(headers: dict[str, str] | None) -> int:
    values = [v for k, v in (headers or {}).items() if k.lower() == "retry-after"]
    assert len(values) == 1, headers
    return int(values[0])


def test_the_503_codes_of_a_placed_request_are_known() -> None:
    # The codes a request placed in a cell can fail with that mean "later", each tested below.
    assert CODES_503 == ["no_batcher", "queue_timeout", "request_lost"]


@pytest.mark.parametrize("code", CODES_503)
def test_a_placed_request_that_fails_with_503_says_when_to_retry(code: str) -> None:
    error = from_request_error(RequestError(req_id="r", message="later", code=code))
    assert error.status == 503 and _retry_after(error.headers) > 0


def test_admission_refusals_say_when_to_retry() -> None:
    for error in (no_batcher_error(), redis_full_error("95% of maxmemory used")):
        assert error.status == 503 and _retry_after(error.headers) > 0


def test_any_503_gets_retry_after_and_keeps_one_given() -> None:
    plain = OpenAIError(503, "the batch queue is unavailable", type="server_error")
    assert _retry_after(plain.headers) > 0
    given = OpenAIError(503, "later", headers={"retry-after": "7", "X-Other": "1"})
    assert _retry_after(given.headers) == 7 and given.headers == {"retry-after": "7", "X-Other": "1"}
    assert OpenAIError(400, "bad").headers is None
    assert OpenAIError(429, "slow down", headers={"Retry-After": "3"}).headers == {"Retry-After": "3"}


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.ConnectionError("refused"),
        redis.exceptions.ResponseError("OOM command not allowed when used memory > 'maxmemory'."),
    ],
    ids=["unreachable", "full"],
)
def test_redis_failures_are_503_with_retry_after(exc: redis.exceptions.RedisError) -> None:
    response = asyncio.run(_redis_error(_request(), exc))
    assert response.status_code == 503 and int(response.headers["retry-after"]) > 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_the_http_answer_carries_the_header_in_both_error_shapes(path: str) -> None:
    error = from_request_error(RequestError(req_id="r", message="no batcher", code="no_batcher"))
    response = asyncio.run(_openai_error(_request(path), error))
    assert response.status_code == 503 and int(response.headers["retry-after"]) > 0


def test_a_503_http_exception_gets_retry_after() -> None:
    from starlette.exceptions import HTTPException

    response = asyncio.run(_http_error(_request(), HTTPException(503, "unavailable")))
    assert response.status_code == 503 and int(response.headers["retry-after"]) > 0


def test_health_503s_say_when_to_look_again() -> None:
    # gateway/health.py answers every 503 through `unavailable` (no_worker included).
    health = unavailable("unavailable", "no_worker", "no worker heartbeat in the last 5 s")
    assert health.status_code == 503 and _retry_after(health.headers) > 0
