"""What one gateway counts on top of a Redis reading of its queue (gateway/limits/queue_bound.py)."""

from __future__ import annotations

from gateway.limits.queue_bound import _Unseen


def test_a_request_written_while_a_reading_is_in_flight_is_still_counted_by_it() -> None:
    unseen = _Unseen()
    unseen.admitted["a"] = 2
    began = unseen.begin_reading()  # sent before "a" is written: its answer may not show it
    unseen.release("a")  # written
    later = unseen.begin_reading()  # sent after: Redis shows "a"
    assert unseen.end_reading(began) == 2
    assert unseen.end_reading(later) == 0
    assert unseen.released == [] and not unseen.readings  # nothing kept once no reading is in flight


def test_an_admitted_request_counts_until_released() -> None:
    unseen = _Unseen()
    unseen.admitted["a"] = 1
    assert unseen.end_reading(unseen.begin_reading()) == 1
    unseen.release("a")  # no reading in flight: nothing to remember
    assert unseen.released == []
    assert unseen.end_reading(unseen.begin_reading()) == 0


def test_releases_are_kept_for_the_oldest_reading_in_flight() -> None:
    unseen = _Unseen()
    unseen.admitted.update(a=1, b=1)
    first = unseen.begin_reading()
    unseen.release("a")
    second = unseen.begin_reading()
    unseen.release("b")
    assert unseen.end_reading(second) == 1  # "b" only; "a" is kept for the first
    assert unseen.end_reading(first) == 2
    assert unseen.released == []
