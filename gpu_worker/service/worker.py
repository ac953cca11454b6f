"""The worker service: receive a step from Redis, launch it, publish tokens and the result.

Steps are read on a thread of their own and publishing runs on another (step_inbox.py,
publish_thread.py): while a launched step runs on the device, the next one is received and launched.

Startup announces the worker (hash entry + hello on the batcher inbox) and starts the heartbeat;
stopping removes both, so the batcher sees a clean exit rather than a missed heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import redis

from common.protocol import (
    FIELD,
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
from gpu_worker.runner.step.launched import StepHandle
from gpu_worker.runner.step_runner import StepRunner
from gpu_worker.service.fenced_writes import FencedWrites, TokenWrites
from gpu_worker.service.heartbeat import Heartbeat
from gpu_worker.service.publish_thread import PublishJob, PublishThread
from gpu_worker.service.step_inbox import DeviceDone, StepInbox, StepMessage
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")

# What `_retry` waits out: an outage, and a Redis that refuses writes (common/redis_io/redis_refusal.py).
_RETRIED: tuple[type[Exception], ...] = (*REDIS_DOWN, redis.ResponseError)


# Steps taken per read: with async scheduling at most two are waiting.
_READ_COUNT = 4


@dataclass(frozen=True, slots=True)
class _Running:
    """A launched step not yet published."""

    handle: StepHandle
    idle_s: float  # how long the worker waited for it (ModelRunnerOutput.worker_idle_s)


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
        inbox = StepInbox(self._read_steps, self.steps_stream, self._last_id)
        try:
            self._serve(inbox, publish_thread)
            publish_thread.drain()
        finally:
            inbox.stop()
            publish_thread.stop()
            self._heartbeat.stop()
            self.deregister()
            logger.info("worker %s stopped", self.worker_id)

    def _serve(self, inbox: StepInbox, publish_thread: PublishThread) -> None:
        """Take steps and device ends as they come (step_inbox.py). A step that comes while the last
        one still runs on the device is launched before that one is published, so the host builds
        it while the device runs; a step done when launched (every CPU step) is published at once."""
        running: _Running | None = None  # launched, on the device, not yet published
        idle_since: float | None = None  # when this worker last ran out of steps
        while not self._stopping.is_set():
            if self._heartbeat.fenced.is_set() or publish_thread.fenced.is_set():
                if running is not None:
                    self._publish(publish_thread, running)
                    running = None
                publish_thread.drain()  # what was queued for the old id is refused by the fence
                publish_thread.fenced.clear()
                self._rejoin()
                inbox.follow(self.steps_stream, self._last_id)
                idle_since = None
                continue
            item = inbox.get(timeout=MAX_BLOCK_MS / 1000)
            if isinstance(item, DeviceDone):
                if running is not None and item.handle is running.handle:
                    self._publish(publish_thread, running)
                    running, idle_since = None, time.perf_counter()
                continue
            if item is None or item.stream != self.steps_stream:
                continue  # nothing came (a chance to notice a stop or a fence), or it was for an old id
            received_at = time.perf_counter()
            self._last_id = item.entry_id
            scheduler_output = self._decode_step(item)
            if scheduler_output is None:
                continue
            # How long this worker waited on the batcher: the cost async scheduling hides.
            idle_s = received_at - idle_since if running is None and idle_since is not None else 0.0
            launched = _Running(self.runner.launch(scheduler_output), idle_s)
            if running is not None:
                self._publish(publish_thread, running)
            running = None
            if launched.handle.ready():
                self._publish(publish_thread, launched)
                idle_since = time.perf_counter()
            else:
                running = launched
                inbox.watch(launched.handle)
        if running is not None:
            self._publish(publish_thread, running)

    def _publish(self, publish_thread: PublishThread, step: _Running) -> None:
        """Queue a step's writes for the publish thread, waiting for the device if it still runs."""
        output = step.handle.get_output()
        output.worker_idle_s = step.idle_s
        for req_id, message in output.req_errors.items():
            logger.warning("request failed: %s", message, extra={"request_id": req_id})
        publish_thread.submit(self.publish_job_for(step.handle))

    # ---- the three calls of the loop ------------------------------------------------------------

    def _read_steps(self, stream: str, after_id: str) -> list[tuple[str, bytes | None]] | None:
        """The steps stream's entries after `after_id`, blocking about a second at most (the
        inbox's reading thread; a Redis outage is waited out there); None once stopping."""
        return self._retry(partial(self._read_step, stream, after_id))

    def _read_step(self, stream: str, after_id: str) -> list[tuple[str, bytes | None]]:
        """As hiredis parses an XREAD reply: packed once, no per-command layers."""
        if not raw_capable(self.redis):  # Redis Cluster: redis-py routes it
            reply = raw_reply(self.redis.xread({stream: after_id}, count=_READ_COUNT, block=MAX_BLOCK_MS))
        else:
            command = pack("XREAD", "COUNT", _READ_COUNT, "BLOCK", MAX_BLOCK_MS, "STREAMS", stream, after_id)
            reply = execute(self.redis, command)[0]
        found = stream_replies.streams(reply)
        return stream_replies.entries(found[0][1]) if found else []

    def _decode_step(self, item: StepMessage) -> SchedulerOutput | None:
        try:
            assert item.message is not None, "no message field"
            return decode_step(item.message)
        except Exception:  # a malformed message cannot be answered (no step id); skip it loudly
            logger.exception("undecodable step message %s", item.entry_id)
            return None

    def publish_job_for(self, handle: StepHandle) -> PublishJob:
        """The writes of a finished step, taken now: token events read request state the next step frees."""
        output = handle.get_output()
        tokens = TokenWrites()
        for e in handle.events:
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
