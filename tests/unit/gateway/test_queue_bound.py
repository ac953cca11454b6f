"""What one gateway counts on top of a Redis reading of its queue (gateway/limits/queue_bound.py)."""

from __future__ import annotations

from gateway.limits.queue_bound import _Unseen


def test_a_reading_asks_about_the_requests_admitted_before_it_was_sent() -> None:
    unseen = _Unseen()
    unseen.admit("a", ["a0", "a1"])
    began, asked = unseen.begin_reading()
    assert asked == ["a0", "a1"]
    unseen.release("a")  # written while the reading is in flight: the reading says whether it shows it
    assert unseen.end_reading(began, len(asked), num_written=2) == 0
    assert unseen.end_reading(*_reading(unseen), num_written=0) == 0  # released: Redis counts it now


def test_an_admitted_request_not_yet_written_counts_until_released() -> None:
    unseen = _Unseen()
    unseen.admit("a", ["a"])
    began, asked = unseen.begin_reading()
    assert unseen.end_reading(began, len(asked), num_written=0) == 1
    unseen.release("a")  # no reading in flight: nothing to remember
    assert unseen.late == []
    assert unseen.end_reading(*_reading(unseen), num_written=0) == 0


def test_requests_admitted_after_a_reading_was_sent_count_for_it() -> None:
    unseen = _Unseen()
    first, asked = unseen.begin_reading()
    unseen.admit("a", ["a"])
    unseen.admit("b", ["b0", "b1"])
    second, asked_later = unseen.begin_reading()
    unseen.release("a")  # written after both readings were sent; the second asks about it
    assert asked == [] and asked_later == ["a", "b0", "b1"]
    assert unseen.end_reading(second, len(asked_later), num_written=1) == 2  # "b" not written yet
    assert unseen.end_reading(first, len(asked), num_written=0) == 3  # it could not ask about either
    assert unseen.late == [] and not unseen.readings  # nothing kept once no reading is in flight


def _reading(unseen: _Unseen) -> tuple[int, int]:
    began, asked = unseen.begin_reading()
    return began, len(asked)
