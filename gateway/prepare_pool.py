"""A request's CPU work, off the event loop when the request is large: parsing and validating its
JSON body, rendering its chat template, tokenizing it (and decoding /detokenize's ids).

One event loop serves every client of a gateway process, so a 3 MB prompt tokenized on it (1.4 to
7 s) made every other request wait as long. A job for a body of `inline_bytes` or more runs on one of
`num_threads` threads instead. The tokenizer releases the GIL while it works (ModelTokenizer calls
its batch methods, which do); pydantic and jinja hold it, but CPython hands it to the loop at least
every switch interval (5 ms), so the loop keeps serving either way; only a long C call that keeps
the GIL, as `json.loads` of a million numbers, still holds it (measured: docs/reliability.md,
*A large request*). A smaller body costs less than the hop to a thread, and runs where it is.

At most `num_threads` jobs run at once; the others wait their turn holding only their bodies, so a
burst of large requests takes the tokenizer's memory (about 120 bytes per byte of text) for
`num_threads` bodies at a time, not for all of them. After a job of `trim_bytes` or more the thread
hands the memory it freed back to the system (gateway/malloc_trim.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from starlette.requests import Request

from gateway.malloc_trim import malloc_trim

P = ParamSpec("P")
T = TypeVar("T")

# Below this, what a job freed is reused by the next one as it is; above it, it is worth returning.
TRIM_BYTES = 1024 * 1024


def body_size(request: Request) -> int | None:
    """The size of the request's body as its client declared it; None for a chunked body."""
    declared = request.headers.get("content-length")
    return int(declared) if declared is not None and declared.isdigit() else None


def _trimmed(job: Callable[[], T]) -> T:
    try:
        return job()
    finally:
        malloc_trim()


class PreparePool:
    """Runs a request's CPU work where its size says: on the event loop, or on a bounded pool."""

    def __init__(self, num_threads: int, inline_bytes: int, trim_bytes: int = TRIM_BYTES) -> None:
        self._executor = ThreadPoolExecutor(num_threads, thread_name_prefix="prepare")
        self.inline_bytes = inline_bytes
        self.trim_bytes = trim_bytes
        # Jobs begun, and those not finished (running, or waiting for a thread): a test follows a
        # request's jobs by them.
        self.num_started = 0
        self.num_unfinished = 0

    async def run(self, num_bytes: int | None, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` for a request whose body has `num_bytes` (None: unknown, or work
        that is heavy whatever the size): on the event loop below `inline_bytes`, else on a thread,
        with the caller's context variables. Its exceptions are raised here."""
        self.num_started += 1
        self.num_unfinished += 1
        try:
            if num_bytes is not None and num_bytes < self.inline_bytes:
                return fn(*args, **kwargs)
            job = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
            trim = num_bytes is None or num_bytes >= self.trim_bytes
            work = functools.partial(_trimmed, job) if trim else job
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        finally:
            self.num_unfinished -= 1

    def close(self) -> None:
        """Jobs not started are dropped; a running one finishes on its thread."""
        self._executor.shutdown(wait=False, cancel_futures=True)
