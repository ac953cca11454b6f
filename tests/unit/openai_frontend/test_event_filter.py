"""Readers enforce one writer per token stream: repeated indexes and stale attempts are dropped."""

from __future__ import annotations

from common.protocol import TokenEvent
from openai_frontend.follow.token_stream import EventFilter


def _event(index: int, attempt: int, token_id: int = 7) -> TokenEvent:
    return TokenEvent(req_id="r", index=index, token_id=token_id, attempt=attempt)


def test_duplicates_and_stale_attempts_are_dropped() -> None:
    f = EventFilter()
    assert f.accept(_event(0, 0))
    assert f.accept(_event(1, 0))
    assert not f.accept(_event(1, 0))  # duplicate index
    # A failover: the new attempt replays what the client has, then continues.
    assert not f.accept(_event(0, 1))
    assert not f.accept(_event(1, 1))
    assert f.accept(_event(2, 1))
    assert not f.accept(_event(3, 0))  # the old writer woke up late
    assert f.accept(_event(3, 1))
    assert (f.next_index, f.attempt) == (4, 1)
