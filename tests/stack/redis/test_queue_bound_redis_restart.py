"""The queue bound after Redis restarts from its AOF under load: it still admits a fresh request.

Redis 7.0 writes a claim (XREADGROUP) to the AOF as `XCLAIM ... LASTID`, which moves the group's last
delivered id but not its read counter. So a Redis restarted from an AOF whose base was rewritten after
some claims reports a `lag` of every request claimed since that rewrite, although none is unclaimed,
and the error carries over to the next rewrite and grows with each restart. The gateway counted that
lag as waiting requests: with a bound of 20 it answered 429 to every request after a chaos run
("127 requests are waiting", then 142). Each round here claims requests after an AOF rewrite (which
Redis also starts by itself as the file grows) and then SIGKILLs Redis while they run.
"""

from __future__ import annotations

import signal
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import redis

from common import streams
from common.redis_io.redis_conn import as_str, entry_key
from harness.load import fault_clients as fault
from harness.processes.redis_process import RedisProcess
from harness.processes.services import Stack, wait_for

BOUND = 20
NUM_ROUNDS = 3
NUM_IN_FLIGHT = 12  # per round: with three rounds, a stale lag alone passes the bound
BODY = {"prompt": [5, 6, 7], "max_tokens": 24, "temperature": 0}


def _group(client: Any) -> dict[str, Any]:
    (group,) = client.xinfo_groups(streams.REQUESTS_STREAM)
    return dict(group)


def _all_claimed(client: Any, num_entries: int) -> bool:
    """The stream holds `num_entries` and the batcher's group has been handed the last of them (its
    read counter is what Redis gets wrong, so it is not asked)."""
    if int(client.xlen(streams.REQUESTS_STREAM)) < num_entries:
        return False
    ((last_id, _),) = client.xrevrange(streams.REQUESTS_STREAM, count=1)
    return entry_key(as_str(_group(client)["last-delivered-id"])) >= entry_key(as_str(last_id))


def _check_done(replies: list[Future[httpx.Response]]) -> None:
    failed = [r.text for r in (f.result(timeout=120) for f in replies) if r.status_code != 200]
    assert not failed, f"{len(failed)} requests failed: {failed[:3]}"


def _rewrite_aof(client: Any) -> None:
    client.bgrewriteaof()

    def done() -> bool:
        info = client.info("persistence")
        return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]

    wait_for(done, 30, "the AOF rewrite to finish")


def _healthy(base_url: str) -> bool:
    return httpx.get(f"{base_url}/health", timeout=5).status_code == 200


def test_a_bound_of_20_admits_after_redis_sigkills(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis")
    server.start()
    stack = Stack(redis_url=server.url, model_dir=tiny_model_dir, log_dir=tmp_path)
    try:
        stack.start_all(
            batcher_env=fault.FAST_TAKEOVER_ENV,
            worker_env=fault.WORKER_ENV,
            gateway_env={"GATEWAY_MAX_QUEUED_REQUESTS": str(BOUND)},
        )
        with ThreadPoolExecutor(max_workers=NUM_IN_FLIGHT) as pool:

            def claimed_batch() -> list[Future[httpx.Response]]:
                """NUM_IN_FLIGHT requests, sent and claimed by the batcher (still running, or done)."""
                num_entries = int(probe.xlen(streams.REQUESTS_STREAM)) + NUM_IN_FLIGHT
                replies = [
                    pool.submit(httpx.post, f"{stack.base_url}/v1/completions", json=BODY, timeout=120)
                    for _ in range(NUM_IN_FLIGHT)
                ]
                wait_for(lambda: _all_claimed(probe, num_entries), 60, "the batcher to claim the requests")
                return replies

            for _ in range(NUM_ROUNDS):
                probe: Any = redis.Redis.from_url(server.url)
                _check_done(claimed_batch())  # the group's read counter is valid again after this
                _rewrite_aof(probe)  # ... and in the AOF's base
                in_flight = claimed_batch()  # read since the rewrite: replayed without the counter
                probe.close()
                server.stop(signal.SIGKILL)
                server.start()
                _check_done(in_flight)
                wait_for(lambda: _healthy(stack.base_url), 30, "/health to answer 200 again")
        stack.check_alive()
        probe = redis.Redis.from_url(server.url)
        group = _group(probe)
        # The path was taken: Redis itself now reports more unclaimed requests than the bound.
        assert group["pending"] == 0 and group["lag"] > BOUND, group
        resp = httpx.post(f"{stack.base_url}/v1/completions", json=BODY, timeout=120)
        assert resp.status_code == 200, resp.text
        gateway_log = (tmp_path / "gateway.log").read_text(errors="replace")
        assert "the batcher group's lag is" in gateway_log, "the stale lag was not reported"
    finally:
        stack.stop()
        server.stop(signal.SIGKILL)
