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


def test_an_index_past_a_gap_waits_for_the_new_attempt() -> None:
    """A failover lost the stream's last entries; the old writer's retried publish lands index 22 on
    the promoted replica, where the client has 0..20. Taking it would lose index 21 for good."""
    f = EventFilter()
    for i in range(21):
        assert f.accept(_event(i, 0))
    assert not f.accept(_event(22, 0, token_id=9))  # past the gap
    # The new attempt recomputes from what the promoted replica held (index 10 on) and writes 21.
    assert not any(f.accept(_event(i, 1)) for i in range(10, 21))
    assert f.accept(_event(21, 1))
    assert f.accept(_event(22, 1))
    assert (f.next_index, f.attempt) == (23, 1)


def test_a_reader_resuming_after_an_entry_takes_its_first_index() -> None:
    f = EventFilter(next_index=None)
    assert f.accept(_event(5, 0))
    assert not f.accept(_event(7, 0))
    assert f.accept(_event(6, 0))
