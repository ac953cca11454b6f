"""Submits a prepared request to Redis and follows it to its end; aborts it when the client goes away."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Coroutine
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

from common.logging_setup import bind_request_id
from common.protocol import GenerateRequest, PoolingEvent, PromptEvent, TokenEvent
from common.redis_io.redis_conn import RETENTION_S, entry_key
from common.redis_io.retry import retry_async
from common.stream_client import abort_async, submit_once_on
from openai_frontend.follow.deadlines import FollowDeadlines
from openai_frontend.follow.metrics import RequestMetrics, TrackedRequest
from openai_frontend.follow.token_mux import TokenStreamMux
from openai_frontend.follow.token_stream import RequestFailed, RequestTimedOut, follow_token_stream
from openai_frontend.generate.request import PreparedRequest
from openai_frontend.generate.request_meta import save_meta
from openai_frontend.model.served_models import ServedModels
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.text.output_processor import OutputProcessor

logger = logging.getLogger(__name__)

# How long shutdown waits for aborts still on their way to Redis.
_ABORT_DRAIN_S = 5.0
# How long a submit is retried while Redis is unreachable (a restart, a failover) before a 503.
SUBMIT_RETRY_S = 3.0


@dataclass(slots=True, frozen=True)
class FollowPolicy:
    """What one follower of a request does when it stops before the end (see docs/reliability.md)."""

    may_abort: bool = True  # leaving early aborts the request; a fetch by id only looks
    grace_s: float = 0.0  # client gone: wait this long for a resume before aborting (0: at once)
    track: bool = True  # count the request in the follower's metrics (its first follower only)
    wait_s: float | None = None  # give up after this long (RequestTimedOut) instead of the request timeout
    # Stopping early never aborts (stop strings still do): a batch task handing its lines over to its
    # next run leaves them generating, and aborts them itself when the batch is cancelled.
    leave_running: bool = False


@dataclass(slots=True, frozen=True)
class Output:
    entry_id: str  # token stream entry that produced this text: the SSE id
    text: str
    finish_reason: str | None
    num_output_tokens: int  # tokens generated so far, for usage
    num_cached_tokens: int  # prompt tokens served from the prefix cache, for usage
    token_ids: list[int]  # tokens accepted since the previous Output
    events: list[TokenEvent]  # their token events (with logprobs when the request asked)
    prompt: PromptEvent | None = None  # the prompt's logprobs, on an Output of its own before any text


class RequestFollower:
    def __init__(
        self,
        redis: aioredis.Redis,
        models: ServedModels,
        request_timeout_s: float,
        metrics: RequestMetrics | None = None,
        retention_s: int = RETENTION_S,
        follow_ahead_s: float = 0.0,
    ) -> None:
        self._redis = redis
        # One shared read per cell for every token stream followed here.
        self._mux = TokenStreamMux(redis)
        self._models = models  # each request is rendered by its base model's tokenizer
        self._metrics = metrics
        self._request_timeout_s = request_timeout_s
        # Aborts (and other writes) run as their own tasks: a cancelled stream cannot await in its finally.
        self._pending_aborts: set[asyncio.Task[None]] = set()
        # Followed requests stay alive through deadlines in Redis; the batcher aborts passed ones.
        self.follow_deadlines = FollowDeadlines(redis, follow_ahead_s)
        # The request cannot run past its timeout (while a gateway follows it); then the resume window.
        # When it ends, the batcher cuts the TTL to the resume window (retention_s).
        self._meta_ttl_s = int(request_timeout_s) + retention_s

    @property
    def mux(self) -> TokenStreamMux:
        """The shared read of the token streams followed here (pooling results are read through it too)."""
        return self._mux

    def tokenizer(self, request: PreparedRequest) -> ModelTokenizer:
        """The tokenizer of the request's base model (404 if this process no longer serves it)."""
        return self._models.get(request.base_model).tokenizer

    def token_text(self, request: PreparedRequest, token_id: int) -> str:
        """One token's own text, special tokens too (the thoughts' tokens are counted by it)."""
        return self.tokenizer(request).decode([token_id], skip_special_tokens=False)

    async def submit(self, request: PreparedRequest, keep_meta: bool = False) -> None:
        """Append the request (and with `keep_meta`, its record first: a single choice, which a
        client may resume or fetch by id) in one round trip.

        Retried for a few seconds while Redis is unreachable: it is safe to repeat, since the entry
        is written only once per request id (the submit_once marker) and the record is the same.
        """
        message = request.message
        meta = request if keep_meta else None
        await retry_async(lambda: self._submit_once(message, meta), SUBMIT_RETRY_S)
        # The client's end user and labels go to the log with it, for abuse tracing and accounting.
        labels = f", user {message.user!r}" if message.user else ""
        labels += f", metadata {json.dumps(request.metadata, sort_keys=True)}" if request.metadata else ""
        logger.info(
            "request queued: %d prompt tokens, max_tokens %d%s",
            len(message.prompt_token_ids),
            message.sampling_params.max_tokens,
            labels,
            extra={"request_id": request.req_id},
        )

    async def _submit_once(self, message: GenerateRequest, meta: PreparedRequest | None) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            if meta is not None:
                save_meta(pipe, meta, self._meta_ttl_s)
            # Not trimmed here: the batcher trims the stream by age, sparing pending entries.
            submit_once_on(pipe, message)
            await pipe.execute()

    def abort_later(self, req_id: str, reason: str) -> None:
        """Tell the batcher to stop `req_id`, without awaiting (safe inside a cancelled task)."""
        self._in_background(self._send_abort(req_id, reason))

    def _in_background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._pending_aborts.add(task)
        task.add_done_callback(self._pending_aborts.discard)

    async def _send_abort(self, req_id: str, reason: str) -> None:
        try:
            await abort_async(self._redis, req_id, reason)
        except redis.exceptions.RedisError as exc:
            logger.warning("could not abort %s (%s): %s", req_id, reason, exc, extra={"request_id": req_id})

    async def drain(self) -> None:
        # A gateway going away leaves its requests running: their clients may resume through
        # another gateway until their follow deadlines pass, and then the batcher aborts them.
        await self.follow_deadlines.close()
        if self._pending_aborts:
            await asyncio.wait(set(self._pending_aborts), timeout=_ABORT_DRAIN_S)
        await self._mux.close()

    async def outputs(
        self, request: PreparedRequest, follow: FollowPolicy | None = None, final_only: bool = False
    ) -> AsyncGenerator[Output | None, None]:
        """Text deltas until the request finishes; None after a read that brought no token.

        The Nones let callers check regularly that their client is still there. Raises RequestFailed
        when the request fails and RequestTimedOut past the request timeout. Leaving early aborts the
        request in the batcher: at once on a timeout or with no grace, else when its follow
        deadline passes `follow.grace_s` later unless a client resumed (openai_frontend/follow/deadlines.py).
        Replaying a stream from its start (a resume) goes through exactly this code, so the text,
        its split into deltas and the stop-string cut are the same.
        `final_only` (a caller that wants the answer whole): its tokens are read once, when it ended
        (token_mux.py), unless it has stop strings, which are matched as the tokens come so that a
        hit aborts the request at once.
        """
        follow = follow or FollowPolicy()
        bind_request_id(request.req_id)  # this task's log lines are about this request from now on
        processor = OutputProcessor(
            self.tokenizer(request),
            request.message.prompt_token_ids,
            request.stop,
            skip_special_tokens=request.skip_special_tokens,
            include_stop=request.include_stop_str_in_output,
        )
        tracker = None
        if follow.track and self._metrics is not None:
            tracker = self._metrics.track(
                request.message.arrival_time, request.num_prompt_tokens, request.base_model
            )
        # Counted from arrival, so a resumed follower gets what is left of the request's time.
        left_s = self._request_timeout_s - max(0.0, time.time() - request.message.arrival_time)
        deadline = time.monotonic() + (left_s if follow.wait_s is None else min(left_s, follow.wait_s))
        done = timed_out = False
        held = follow.may_abort and not follow.leave_running
        if held:
            self.follow_deadlines.hold(request.req_id)
        token_ids: list[int] = []
        events: list[TokenEvent] = []
        texts: list[str] = []  # with final_only: the text so far, handed over in one Output at the end
        num_cached_tokens = 0
        final_only = final_only and not request.stop
        try:
            batches = follow_token_stream(
                self._mux, request.req_id, deadline=deadline, submitted=True, final_only=final_only
            )
            async with aclosing(batches):
                async for batch in batches:
                    read_at = time.monotonic()
                    ready: list[Output] = []
                    num_read = 0
                    first_entry_id = ""  # of the batch's first token
                    for entry_id, event in batch:
                        if isinstance(event, PromptEvent):
                            num_cached_tokens = event.num_cached_tokens
                            ready.append(
                                Output(entry_id, "", event.finish_reason, 0, num_cached_tokens, [], [], event)
                            )
                            if event.finish_reason is not None:
                                done = True  # it generates nothing (max_tokens 0)
                                break
                            continue
                        if isinstance(event, PoolingEvent):
                            continue  # a pooling request's result: never on a generation's stream
                        num_read += 1
                        first_entry_id = first_entry_id or entry_id
                        token_ids.append(event.token_id)
                        events.append(event)
                        if event.index == 0:
                            num_cached_tokens = event.num_cached_tokens
                        delta = processor.process(event.token_id, event.finish_reason)
                        if delta.stop_string_hit and follow.may_abort:
                            self.abort_later(request.req_id, "stop")
                        if final_only and delta.finish_reason is None:
                            texts.append(delta.text)  # one Output for the answer, not one per token
                        elif delta.text or delta.finish_reason is not None:
                            texts.append(delta.text)
                            ready.append(
                                Output(
                                    entry_id,
                                    "".join(texts),
                                    delta.finish_reason,
                                    processor.num_output_tokens,
                                    num_cached_tokens,
                                    token_ids,
                                    events,
                                )
                            )
                            token_ids, events, texts = [], [], []
                        if delta.finish_reason is not None:
                            done = True
                            break
                    # Metrics first: a caller may stop iterating right after the last output.
                    if tracker is not None:
                        # Read whole at the end: its tokens are timed by when Redis took them.
                        first_at = _taken_at(first_entry_id, read_at) if final_only and num_read else None
                        tracker.on_tokens(num_read, read_at, first_at)
                        if done:
                            self._log_finished(tracker, ready[-1].finish_reason or "stop", read_at)
                    for out in ready:
                        yield out
                    if done:
                        return
                    # Only a read with no token (the reader's tick, about once a second): tokens
                    # that show no text yet (a special one, part of a character) are no reason to
                    # ask after the client, which costs the gateway's CPU per token.
                    if not ready and not num_read:
                        yield None
        except RequestFailed as exc:
            done = True  # the request is over on the server side already
            if tracker is not None:
                tracker.finish("error")
            logger.warning("request failed: %s", exc)
            raise
        except RequestTimedOut:
            timed_out = True
            if follow.may_abort:
                logger.warning("request %s timed out after %.0f s", request.req_id, self._request_timeout_s)
            raise
        finally:
            if not done and tracker is not None:
                tracker.finish("abort")
            if held:
                if done or timed_out or follow.grace_s <= 0:
                    self.follow_deadlines.release(request.req_id, ended=True)
                else:
                    logger.info("client left: aborting in %.0f s unless it resumes", follow.grace_s)
                    self.follow_deadlines.release(request.req_id, ended=False, grace_s=follow.grace_s)
                if not done and (timed_out or follow.grace_s <= 0):
                    self.abort_later(request.req_id, "abort")

    @staticmethod
    def _log_finished(tracker: TrackedRequest, reason: str, now: float) -> None:
        e2e = tracker.finish(reason, now)
        logger.info(
            "request finished (%s): %d prompt + %d output tokens, ttft %.3f s, e2e %.3f s",
            reason,
            tracker.num_prompt_tokens,
            tracker.num_output_tokens,
            tracker.ttft or 0.0,
            e2e,
        )


def _taken_at(entry_id: str, now: float) -> float:
    """When Redis took a stream entry (its id is its time in unix ms), on the monotonic clock `now` is on."""
    return now - max(0.0, time.time() - entry_key(entry_id)[0] / 1000)
