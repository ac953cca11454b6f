"""The worker service: receive a step from Redis, execute it, publish tokens and the result.

Publishing runs on a thread of its own (publish_thread.py), so the next step starts at once.

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
    SchedulerOutput,
    WorkerInfo,
    decode_step,
    encode,
    ends_stream,
)
from common.redis_io import stream_replies
from common.redis_io.command_packer import pack
from common.redis_io.raw_command import execute, raw_capable
from common.redis_io.redis_conn import MAX_BLOCK_MS, connect, min_id
from common.redis_io.redis_refusal import refuses_writes
from common.redis_io.retry import REDIS_DOWN, Backoff
from common.redis_io.stream_replies import raw_reply
from common.streams import cell_keys, token_stream
from gpu_worker.runner.step_runner import StepRunner
from gpu_worker.service.fenced_writes import FencedWrites, TokenWrites
from gpu_worker.service.heartbeat import Heartbeat
from gpu_worker.service.publish_thread import PublishJob, PublishThread
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")

# What `_retry` waits out: an outage, and a Redis that refuses writes (common/redis_io/redis_refusal.py).
_RETRIED: tuple[type[Exception], ...] = (*REDIS_DOWN, redis.ResponseError)


class Worker:
    def __init__(self, settings: WorkerSettings, runner: StepRunner) -> None:
        self.settings = settings
        self.runner = runner
        self.redis = connect(settings.redis_url, settings.redis_cluster)
        self.keys = cell_keys(settings.cell)
        self._fenced_writes = FencedWrites(self.redis, self.keys)
        self._stopping = threading.Event()
        self._generation = 0  # times this process rejoined after being fenced
        self._use_id(settings.worker_id)

    def _use_id(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.runner.worker_id = worker_id
        self.steps_stream = self.keys.worker_steps(worker_id)
        self._last_id = "0-0"  # the stream is new: this worker id has never existed before
        self._heartbeat = Heartbeat(
            connect(self.settings.redis_url, self.settings.redis_cluster),
            worker_id,
            self.settings.heartbeat_interval_s,
            self.keys,
            self.settings.health_file,
        )

    def info(self) -> WorkerInfo:
        return self.runner.worker_info()

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
        publish_thread = PublishThread(lambda job: self._retry(partial(self.publish_job, job)))
        try:
            executed_at: float | None = None
            while not self._stopping.is_set():
                if self._heartbeat.fenced.is_set() or publish_thread.fenced.is_set():
                    publish_thread.drain()  # what was queued for the old id is refused by the fence
                    publish_thread.fenced.clear()
                    self._rejoin()
                    executed_at = None
                    continue
                scheduler_output = self._retry(self.receive)
                if scheduler_output is None:
                    continue
                received_at = time.perf_counter()
                output = self.execute(scheduler_output)
                for req_id, message in output.req_errors.items():
                    logger.warning("request failed: %s", message, extra={"request_id": req_id})
                # How long this worker waited on the batcher: the cost async scheduling hides.
                output.worker_idle_s = received_at - executed_at if executed_at is not None else 0.0
                publish_thread.submit(self.publish_job_for(output))
                executed_at = time.perf_counter()
            publish_thread.drain()
        finally:
            publish_thread.stop()
            self._heartbeat.stop()
            self.deregister()
            logger.info("worker %s stopped", self.worker_id)

    # ---- the three calls of the loop ------------------------------------------------------------

    def receive(self) -> SchedulerOutput | None:
        reply = self._read_step()
        found = stream_replies.streams(reply)
        if not found:
            return None
        self._last_id, message = stream_replies.entries(found[0][1])[0]
        try:
            assert message is not None, "no message field"
            return decode_step(message)
        except Exception:  # a malformed message cannot be answered (no step id); skip it loudly
            logger.exception("undecodable step message %s", self._last_id)
            return None

    def _read_step(self) -> Any:
        """The next step, as hiredis parses an XREAD reply: packed once, no per-command layers."""
        block, last_id = MAX_BLOCK_MS, self._last_id
        if not raw_capable(self.redis):  # Redis Cluster: redis-py routes it
            return raw_reply(self.redis.xread({self.steps_stream: last_id}, count=1, block=block))
        command = pack("XREAD", "COUNT", 1, "BLOCK", block, "STREAMS", self.steps_stream, last_id)
        return execute(self.redis, command)[0]

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        output = self.runner.execute_model(scheduler_output)
        output.epoch = scheduler_output.epoch
        return output

    def publish_job_for(self, output: ModelRunnerOutput) -> PublishJob:
        """The writes of a step result, taken now: token events read request state the next step frees."""
        tokens = TokenWrites()
        for e in self.runner.token_events(output):
            tokens.add(token_stream(e.req_id), encode(e), ends_stream(e))
        return PublishJob(self.worker_id, output.step_id, tokens, encode(output), self._last_id)

    def publish_job(self, job: PublishJob) -> bool:
        """Token events and the step result in one atomic, fenced script call.

        Returns False, having written nothing, when the batcher has declared this worker dead.
        Per-request errors are not written here: the batcher decides whether to retry or give up.
        """
        # Only this worker reads its steps stream: whatever it has consumed can go.
        return self._fenced_writes.publish(
            self.redis,
            job.worker_id,
            self.keys.worker_steps(job.worker_id),
            job.tokens,
            job.result,
            inbox_min_id=min_id(self.settings.retention_s),
            steps_min_id=job.steps_min_id,
            token_ttl_s=self.settings.retention_s,
        )

    def _rejoin(self) -> None:
        """Fenced (declared dead while paused): drop every request and join again under a new id.

        Its requests already run elsewhere; a new id means nothing it held can be confused with them.
        Rejoining (rather than exiting) keeps `cbserve up`, which stops everything when a child exits,
        serving after a long pause.
        """
        old_id = self.worker_id
        self._heartbeat.stop()
        self.runner.reset()
        self._generation += 1
        self._use_id(f"{self.settings.worker_id}.{self._generation}")
        logger.warning("worker %s was declared dead by the batcher; rejoining as %s", old_id, self.worker_id)
        self._retry(self.register)
        self._heartbeat.start()

    # ---- registration ---------------------------------------------------------------------------

    def register(self) -> None:
        info = encode(self.info())
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.workers, self.worker_id, info)
        # Alive from the first moment, before the batcher can read the hello and look for a heartbeat.
        pipe.zadd(self.keys.heartbeat, {self.worker_id: int(time.time() * 1000)})
        pipe.xadd(self.keys.inbox, {FIELD: info}, minid=min_id(self.settings.retention_s), approximate=True)
        pipe.execute()

    def deregister(self) -> None:
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hdel(self.keys.workers, self.worker_id)
            pipe.zrem(self.keys.heartbeat, self.worker_id)
            pipe.delete(self.steps_stream)
            pipe.execute()
        except redis.RedisError as exc:  # the batcher will see the heartbeat stop instead
            logger.warning("could not deregister %s: %s", self.worker_id, exc)

    def _retry(self, call: Callable[[], T]) -> T | None:
        """Run `call` until Redis answers or the worker stops; a Redis outage is a pause, not a crash.

        Repeating a publish whose reply was lost may write its tokens twice (same index and attempt:
        readers and recovery drop the copy), but never out of order. After an outage the batcher
        fences every worker anyway, and this one rejoins under a new id.
        """
        backoff = Backoff()
        while True:
            try:
                result = call()
            except _RETRIED as exc:
                # A Redis that refuses writes (full, read-only) is waited out too: the publish script
                # writes all or nothing, so a refused one is sent again whole.
                if isinstance(exc, redis.ResponseError) and not refuses_writes(exc):
                    raise
                if self._stopping.is_set():
                    return None
                if not backoff.failing:
                    logger.warning("redis unavailable, retrying with backoff: %s", exc)
                self._stopping.wait(backoff.next_delay())
                continue
            if backoff.failing:
                logger.info("redis reachable again after %d retries", backoff.num_failures)
            return result
