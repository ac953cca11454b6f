"""One run of a batch by a Celery task: validate it once, run its lines, keep results, finalize.

A run holds the batch's claim and lasts at most `slice_s`; then it leaves its lines generating,
releases the batch and asks for a continuation, which follows them again (their request ids are
derived from the batch and line, and submitted once, so nothing is generated twice). Every result is
written the moment it arrives, so whatever ends a run (its slice, a crash, a lost claim, Redis going
away) costs no finished line. Lines run with bounded concurrency at batch priority; a cancel aborts
the lines in flight. See docs/architecture.md, *The Batch API*.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import json
import logging
import time
from collections import deque
from dataclasses import dataclass

import redis.asyncio as aioredis
import redis.exceptions

from cbserve_celery.batch_claim import BatchClaim
from cbserve_celery.model_tokenizers import ModelTokenizers
from common.stream_client import abort_async
from common.streams import DEFAULT_CELL, batch_claim
from openai_frontend.batch.embedding_lines import EMBEDDINGS_ENDPOINT, run_embedding_line
from openai_frontend.batch.files_store import FileStore
from openai_frontend.batch.input import InputLine, parse_input
from openai_frontend.batch.lines import (
    LineContext,
    LineResult,
    ResultLost,
    Submitted,
    line_req_id,
    result_line,
    run_line,
    unrun_line,
)
from openai_frontend.batch.objects import ACTIVE, BatchParams, BatchState, Status
from openai_frontend.batch.store import BatchStore
from openai_frontend.follow.request_follower import RequestFollower
from openai_frontend.model.lora_registry import LoRARegistry
from openai_frontend.protocol.errors import OpenAIError

logger = logging.getLogger(__name__)

# How often a run looks at the batch's status (cancel) and renews its claim, at most.
_CHECK_S = 0.5
# How long a cancel waits for the lines it aborted to end, to keep those that finished first.
_CANCEL_DRAIN_S = 10.0
_FINAL_FROM: dict[Status, list[Status]] = {
    "completed": ["finalizing"],
    "cancelled": ["cancelling"],
    "expired": list(ACTIVE),
}


# Each line being run now: its task, the line, and the request ids it submitted (what a cancel aborts).
InFlight = dict[asyncio.Task[LineResult], tuple[InputLine, Submitted]]


class Outcome(enum.Enum):
    DONE = "done"  # nothing left for this task: the batch ended, or another task runs it
    CONTINUE = "continue"  # the slice ended: a new task should go on at once
    BUSY = "busy"  # another task holds the batch (or held it and died): try again after the claim TTL


@dataclass(slots=True, frozen=True)
class RunConfig:
    max_lines_in_flight: int  # lines of this batch generating at once
    slice_s: float  # a run ends after this long and hands the batch to a new task
    claim_ttl_s: float
    cell: str = DEFAULT_CELL  # where lines of a model without cells of its own go (CBSERVE_CELL)


def output_file_id(batch_id: str, kind: str) -> str:
    """Derived, so that finalizing again (after a crash) rewrites the same file."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


async def run_batch(
    redis: aioredis.Redis,
    batch_id: str,
    tokenizers: ModelTokenizers,
    config: RunConfig,
    claim_token: str,
) -> Outcome:
    """Run (a slice of) the batch under the task's claim token; closes `redis`, made for this run."""
    try:
        store = BatchStore(redis)
        claim = BatchClaim(redis, batch_claim(batch_id), config.claim_ttl_s, claim_token)
        if not await claim.acquire():
            state = await store.get(batch_id)
            return Outcome.BUSY if state is not None and state.is_active else Outcome.DONE
        try:
            return await _BatchRun(redis, store, claim, tokenizers, config).run(batch_id)
        finally:
            await claim.release()
    finally:
        await redis.aclose()


class _BatchRun:
    def __init__(
        self,
        redis: aioredis.Redis,
        store: BatchStore,
        claim: BatchClaim,
        tokenizers: ModelTokenizers,
        config: RunConfig,
    ) -> None:
        self._redis, self._store, self._claim = redis, store, claim
        self._tokenizers, self._config = tokenizers, config

    async def run(self, batch_id: str) -> Outcome:
        state = await self._store.get(batch_id)
        if state is None or not state.is_active:
            return Outcome.DONE
        lines = await self._validated(state)
        if lines is None:
            return Outcome.DONE
        params = state.params
        models, unserved = self._tokenizers.for_batch(params.models)
        assert models is not None  # _validated failed the batch otherwise
        # A line may wait and run until the batch expires: the request timeout counts from creation.
        window_s = float(params.expires_at - params.created_at)
        follower = RequestFollower(self._redis, models, window_s)
        ctx = LineContext(
            params, models, self._redis, follower, LoRARegistry(self._redis), self._config.cell, unserved
        )
        try:
            return await self._run_lines(ctx, lines)
        finally:
            await follower.drain()

    async def _validated(self, state: BatchState) -> list[InputLine] | None:
        """The batch's lines; moves `validating` on to `in_progress`, or to `failed` for a bad file."""
        params, now = state.params, int(time.time())
        if self._tokenizers.for_batch(params.models)[0] is None:
            await self._fail(params, self._tokenizers.missing_message(params.models))
            return None
        content = await self._store.input(params.id)
        if content is None:
            await self._fail(params, "the batch's copy of its input file has expired")
            return None
        lines, errors = parse_input(content, params.endpoint)
        if state.status != "validating":
            return lines
        if errors:
            await self._store.transition(
                params.id, ["validating"], "failed", failed_at=now, errors=json.dumps(errors)
            )
            logger.info("batch %s failed validation: %s", params.id, errors[0]["message"])
            return None
        if not await self._store.transition(
            params.id, ["validating"], "in_progress", in_progress_at=now, total=len(lines)
        ):
            return None  # cancelled meanwhile
        logger.info("batch %s: %d requests, in progress", params.id, len(lines))
        return lines

    async def _fail(self, params: BatchParams, message: str) -> None:
        errors = json.dumps([{"code": "server_error", "message": message}])
        await self._store.transition(params.id, ACTIVE, "failed", failed_at=int(time.time()), errors=errors)
        logger.error("batch %s failed: %s", params.id, message)

    async def _run_lines(self, ctx: LineContext, lines: list[InputLine]) -> Outcome:
        params, store, config = ctx.params, self._store, self._config
        done = await store.done(params.id)
        attempts = await store.attempts(params.id)
        todo = deque(line for line in lines if line.index not in done)
        in_flight: InFlight = {}
        slice_end = time.monotonic() + config.slice_s
        try:
            while True:
                status = await store.status(params.id)
                if status == "cancelling":
                    await self._cancel(params, in_flight)
                    await self._finalize(params, "cancelled")
                    return Outcome.DONE
                if status not in ("in_progress", "finalizing"):
                    await self._stop(in_flight, abort=True)  # ended elsewhere
                    return Outcome.DONE
                if time.time() >= params.expires_at:
                    await self._expire(
                        params, [line for line, _ in in_flight.values()] + list(todo), in_flight
                    )
                    return Outcome.DONE
                if not todo and not in_flight:
                    await self._finalize(params, "completed")
                    return Outcome.DONE
                if time.monotonic() >= slice_end:
                    return Outcome.CONTINUE  # the lines in flight keep generating for the next run
                if not await self._claim.renew():
                    logger.warning("batch %s: claim lost; another task runs it now", params.id)
                    return Outcome.DONE
                while todo and len(in_flight) < config.max_lines_in_flight:
                    line, submitted = todo.popleft(), Submitted()
                    line_id = line_req_id(params.id, line.index, attempts.get(line.index, 0))
                    run = run_embedding_line if params.endpoint == EMBEDDINGS_ENDPOINT else run_line
                    in_flight[asyncio.create_task(run(ctx, line, line_id, submitted))] = (
                        line,
                        submitted,
                    )
                finished, _ = await asyncio.wait(
                    in_flight, timeout=_CHECK_S, return_when=asyncio.FIRST_COMPLETED
                )
                for task in finished:
                    line, _ = in_flight.pop(task)
                    result = await self._result(params, line, task, attempts)
                    if result is None:
                        todo.appendleft(line)  # its result was lost: it runs again under a new id
                    else:
                        await store.record(params, line.index, result.ok, result.line)
        finally:
            await self._stop(in_flight, abort=False)

    async def _result(
        self, params: BatchParams, line: InputLine, task: asyncio.Task[LineResult], attempts: dict[int, int]
    ) -> LineResult | None:
        try:
            return task.result()
        except ResultLost:
            attempts[line.index] = await self._store.next_attempt(params, line.index)
            logger.warning("batch %s line %d: result lost, submitting it again", params.id, line.index)
            return None
        except redis.exceptions.RedisError:
            raise  # the run ends; the task runs the batch again once Redis answers
        except Exception:  # a bug fails its line, not the batch
            logger.exception("batch %s line %d failed", params.id, line.index)
            req_id = line_req_id(params.id, line.index, attempts.get(line.index, 0))
            error = OpenAIError(500, "internal error while running this request", type="server_error")
            return result_line(line, req_id, 500, error.body())

    async def _cancel(self, params: BatchParams, in_flight: InFlight) -> None:
        """Abort the lines in flight, then keep those that finished before their abort landed.

        A line can reach its last token while the cancel is on its way (the batcher ignores an
        abort of a finished request): as in OpenAI's API, its result counts as completed.
        """
        for _, submitted in in_flight.values():
            for req_id in submitted.req_ids:
                await abort_async(self._redis, req_id)
        if in_flight:
            # Aborted requests end with request_aborted at the batcher's next iteration.
            await asyncio.wait(in_flight, timeout=_CANCEL_DRAIN_S)
        for task, (line, _) in list(in_flight.items()):
            if not task.done() or task.cancelled() or task.exception() is not None:
                continue
            result = task.result()
            if result.ok:
                await self._store.record(params, line.index, True, result.line)
            del in_flight[task]
        await self._stop(in_flight, abort=False)

    async def _stop(self, in_flight: InFlight, abort: bool) -> None:
        """Stop following the lines in flight; with `abort`, stop their requests in the batcher too."""
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        if abort:
            for _, submitted in in_flight.values():
                for req_id in submitted.req_ids:
                    await abort_async(self._redis, req_id)
        in_flight.clear()

    async def _expire(
        self,
        params: BatchParams,
        unfinished: list[InputLine],
        in_flight: InFlight,
    ) -> None:
        await self._stop(in_flight, abort=True)
        message = "This request could not be executed before the completion window expired."
        for line in unfinished:
            req_id = line_req_id(params.id, line.index)
            result = unrun_line(line, req_id, "batch_expired", message)
            await self._store.record(params, line.index, result.ok, result.line)
        await self._finalize(params, "expired")

    async def _finalize(self, params: BatchParams, final: Status) -> None:
        """Write the output and error files (each only if it has lines), then the final status."""
        now = int(time.time())
        if final == "completed":
            await self._store.transition(params.id, ["in_progress"], "finalizing", finalizing_at=now)
        files = FileStore(self._redis)
        fields: dict[str, str | int] = {}
        for ok, kind in ((True, "output"), (False, "error")):
            lines = await self._store.results(params.id, ok)
            if lines:
                meta = await files.put(
                    params.owner,
                    f"{params.id}_{kind}.jsonl",
                    "batch_output",
                    b"".join(line + b"\n" for line in lines),
                    expires_at=params.retain_until,
                    file_id=output_file_id(params.id, kind),
                )
                fields[f"{kind}_file_id"] = meta.id
        fields[f"{final}_at"] = now
        await self._store.transition(params.id, _FINAL_FROM[final], final, **fields)
        logger.info("batch %s %s", params.id, final)
