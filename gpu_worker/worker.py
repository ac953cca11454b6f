"""The worker service: receive a step from Redis, execute it, publish tokens and the result.

Startup announces the worker (hash entry + hello on the batcher inbox) and starts the heartbeat;
stopping removes both, so the batcher sees a clean exit rather than a missed heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import redis

from common.protocol import (
    FIELD,
    ModelRunnerOutput,
    RequestError,
    SchedulerOutput,
    WorkerInfo,
    decode_step,
    encode,
)
from common.redis_conn import MAX_BLOCK_MS, TOKEN_STREAM_TTL_S, connect, min_id
from common.streams import BATCHER_INBOX, WORKERS_HASH, WORKERS_HEARTBEAT, token_stream, worker_steps
from gpu_worker.heartbeat import Heartbeat, beat
from gpu_worker.model_runner import ModelRunner
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

RETRY_WAIT_S = 0.5

T = TypeVar("T")


class Worker:
    def __init__(self, settings: WorkerSettings, runner: ModelRunner) -> None:
        self.settings = settings
        self.runner = runner
        self.worker_id = settings.worker_id
        self.steps_stream = worker_steps(self.worker_id)
        self.redis = connect(settings.redis_url)
        self._last_id = "0-0"  # the stream is new: this worker id has never existed before
        self._stopping = threading.Event()
        self._heartbeat = Heartbeat(
            connect(settings.redis_url), self.worker_id, settings.heartbeat_interval_s, settings.health_file
        )

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            worker_id=self.worker_id,
            model=self.runner.model_name,
            num_blocks=self.runner.num_blocks,
            block_size=self.runner.block_size,
            max_model_len=self.runner.max_model_len,
            started_at=time.time(),
        )

    def stop(self) -> None:
        """Safe from a signal handler: the loop notices within one blocking read (<= 1 s)."""
        self._stopping.set()

    def run(self) -> None:
        self._retry(self.register)
        self._heartbeat.start()
        logger.info(
            "worker %s serving %s: %d blocks x %d tokens, max_model_len %d",
            self.worker_id,
            self.runner.model_name,
            self.runner.num_blocks,
            self.runner.block_size,
            self.runner.max_model_len,
        )
        try:
            published_at: float | None = None
            while not self._stopping.is_set():
                scheduler_output = self._retry(self.receive)
                if scheduler_output is None:
                    continue
                received_at = time.perf_counter()
                output = self.execute(scheduler_output)
                for req_id, message in output.req_errors.items():
                    logger.warning("request failed: %s", message, extra={"request_id": req_id})
                # How long this worker waited on the batcher: the cost async scheduling hides.
                output.worker_idle_s = received_at - published_at if published_at is not None else 0.0
                self._retry(partial(self.publish, output))
                published_at = time.perf_counter()
        finally:
            self._heartbeat.stop()
            self.deregister()
            logger.info("worker %s stopped", self.worker_id)

    # ---- the three calls of the loop ------------------------------------------------------------

    def receive(self) -> SchedulerOutput | None:
        reply: Any = self.redis.xread({self.steps_stream: self._last_id}, count=1, block=MAX_BLOCK_MS)
        if not reply:
            return None
        # RESP2 answers [[stream, [(id, fields)]]], RESP3 {stream: [[(id, fields)]]}.
        entries = reply[0][1] if isinstance(reply, list) else next(iter(reply.values()))[0]
        entry_id, fields = entries[0]
        self._last_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        try:
            return decode_step(fields[FIELD])
        except Exception:  # a malformed message cannot be answered (no step id); skip it loudly
            logger.exception("undecodable step message %s", self._last_id)
            return None

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)

    def publish(self, output: ModelRunnerOutput) -> None:
        """Token events, errors and the step result in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for event in self.runner.token_events(output):
            stream = token_stream(event.req_id)
            pipe.xadd(stream, {FIELD: encode(event)})
            if event.finish_reason is not None:
                pipe.expire(stream, TOKEN_STREAM_TTL_S)
        for req_id, message in output.req_errors.items():
            stream = token_stream(req_id)
            pipe.xadd(stream, {FIELD: encode(RequestError(req_id=req_id, message=message))})
            pipe.expire(stream, TOKEN_STREAM_TTL_S)
        pipe.xadd(BATCHER_INBOX, {FIELD: encode(output)}, minid=min_id(), approximate=True)
        # Only this worker reads its steps stream: whatever it has consumed can go.
        pipe.xtrim(self.steps_stream, minid=self._last_id, approximate=True)
        pipe.execute()

    # ---- registration ---------------------------------------------------------------------------

    def register(self) -> None:
        info = encode(self.info())
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(WORKERS_HASH, self.worker_id, info)
        pipe.xadd(BATCHER_INBOX, {FIELD: info}, minid=min_id(), approximate=True)
        pipe.execute()
        beat(self.redis, self.worker_id)  # alive from the first moment, not one interval later

    def deregister(self) -> None:
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hdel(WORKERS_HASH, self.worker_id)
            pipe.zrem(WORKERS_HEARTBEAT, self.worker_id)
            pipe.delete(self.steps_stream)
            pipe.execute()
        except redis.RedisError as exc:  # the batcher will see the heartbeat stop instead
            logger.warning("could not deregister %s: %s", self.worker_id, exc)

    def _retry(self, call: Callable[[], T]) -> T | None:
        """Run `call` until Redis answers or the worker stops; a Redis outage is a pause, not a crash."""
        failing = False
        while True:
            try:
                result = call()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if self._stopping.is_set():
                    return None
                if not failing:
                    logger.warning("redis unavailable, retrying: %s", exc)
                failing = True
                self._stopping.wait(RETRY_WAIT_S)
                continue
            if failing:
                logger.info("redis reachable again")
            return result
