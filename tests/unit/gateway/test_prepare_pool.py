"""Where a request's CPU work runs (gateway/prepare_pool.py): small ones on the loop, large ones on a
thread, with the caller's context and exceptions either way."""

from __future__ import annotations

import asyncio
import contextvars
import platform
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from gateway.malloc_trim import malloc_trim
from gateway.prepare_pool import PreparePool

T = TypeVar("T")
_TERMS: contextvars.ContextVar[str] = contextvars.ContextVar("terms", default="openai")


def _run(num_bytes: int | None, fn: Callable[[], T]) -> tuple[T, int]:
    """fn's result through a pool with a 1,000-byte threshold, and the thread the loop ran on."""

    async def main() -> tuple[T, int]:
        pool = PreparePool(num_threads=1, inline_bytes=1000)
        try:
            return await pool.run(num_bytes, fn), threading.get_ident()
        finally:
            pool.close()

    return asyncio.run(main())


def _where() -> tuple[int, str]:
    return threading.get_ident(), threading.current_thread().name


def test_a_small_body_is_prepared_on_the_loop() -> None:
    (thread, _), loop_thread = _run(999, _where)
    assert thread == loop_thread


@pytest.mark.parametrize("num_bytes", [1000, None], ids=["large", "unknown-size"])
def test_a_large_body_is_prepared_on_a_pool_thread(num_bytes: int | None) -> None:
    (thread, name), loop_thread = _run(num_bytes, _where)
    assert thread != loop_thread and name.startswith("prepare")


def test_the_job_sees_the_callers_context_variables() -> None:
    async def main() -> str:
        pool = PreparePool(num_threads=1, inline_bytes=0)
        _TERMS.set("anthropic")  # as a route's error-wording context sets it
        try:
            return await pool.run(None, _TERMS.get)
        finally:
            pool.close()

    assert asyncio.run(main()) == "anthropic"


def test_a_jobs_exception_is_raised_to_the_caller_and_the_count_goes_back() -> None:
    def refuse() -> None:
        raise ValueError("prompt too long")

    async def main() -> int:
        pool = PreparePool(num_threads=1, inline_bytes=0)
        try:
            with pytest.raises(ValueError, match="prompt too long"):
                await pool.run(10**7, refuse)
            return pool.num_unfinished
        finally:
            pool.close()

    assert asyncio.run(main()) == 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_memory_a_thread_freed_goes_back_to_the_system() -> None:
    kept: list[bytes] = []

    def churn() -> None:
        blocks = [bytes(2000) for _ in range(20_000)]  # 40 MB of malloc'd chunks in this thread's arena
        kept.append(bytes(2000))  # after them: the arena's top cannot shrink past it by itself
        del blocks

    thread = threading.Thread(target=churn)
    thread.start()
    thread.join()
    assert malloc_trim()  # the free chunks below the kept one were handed back
