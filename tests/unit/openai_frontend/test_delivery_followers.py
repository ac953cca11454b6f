"""The handover between a follower's catch-up read and its delivery stream, in every order.

`DeliveryFollowers` is state only: each test plays one order of "the catch-up read came back" and
"the delivery stream brought entries", and checks the follower gets every entry once, in order.
"""

from __future__ import annotations

from openai_frontend.follow.delivery_followers import DeliveryFollowers, Entry, Subscription


def _entries(*ms: int) -> list[Entry]:
    return [(f"{m}-0", {b"m": str(m).encode()}) for m in ms]


def _drain(sub: Subscription) -> list[str]:
    got: list[str] = []
    while not sub.queue.empty():
        got += [entry_id for entry_id, _ in sub.queue.get_nowait()]
    return got


def _ids(*ms: int) -> list[str]:
    return [f"{m}-0" for m in ms]


def _follow(followers: DeliveryFollowers, req_id: str = "r", last_id: str = "0-0") -> Subscription:
    sub = Subscription(req_id, last_id)
    followers.add(sub, now=0.0)
    return sub


def test_the_read_then_live_entries() -> None:
    followers = DeliveryFollowers()
    sub = _follow(followers)
    assert list(followers.catching_up) == [sub]
    followers.caught_up(sub, _entries(1, 2), complete=True, generation=sub.generation, now=0.0)
    assert not followers.catching_up
    followers.deliver("r", _entries(3), now=0.0)
    assert _drain(sub) == _ids(1, 2, 3)


def test_entries_delivered_while_the_read_is_out_wait_for_it() -> None:
    """Delivered before the read is in: held, then given after the read's entries, without the ones
    both brought (written before the read ran, delivered after)."""
    followers = DeliveryFollowers()
    sub = _follow(followers)
    followers.deliver("r", _entries(2, 3), now=0.0)
    followers.deliver("r", _entries(4), now=0.0)
    assert _drain(sub) == []  # nothing before the read: 1 would come after 2
    followers.caught_up(sub, _entries(1, 2, 3), complete=True, generation=sub.generation, now=0.0)
    assert _drain(sub) == _ids(1, 2, 3, 4)


def test_a_read_past_everything_delivered_gives_no_duplicate() -> None:
    followers = DeliveryFollowers()
    sub = _follow(followers)
    followers.deliver("r", _entries(1), now=0.0)
    followers.caught_up(sub, _entries(1, 2), complete=True, generation=sub.generation, now=0.0)
    followers.deliver("r", _entries(2, 3), now=0.0)  # 2 was written before the read, delivered after
    assert _drain(sub) == _ids(1, 2, 3)


def test_a_resume_point_is_kept() -> None:
    followers = DeliveryFollowers()
    sub = _follow(followers, last_id="2-0")
    followers.deliver("r", _entries(3), now=0.0)
    followers.caught_up(sub, _entries(3), complete=True, generation=sub.generation, now=0.0)
    followers.deliver("r", _entries(4), now=0.0)
    assert _drain(sub) == _ids(3, 4)


def test_a_page_of_a_long_stream_keeps_holding() -> None:
    followers = DeliveryFollowers()
    sub = _follow(followers)
    followers.deliver("r", _entries(5), now=0.0)
    followers.caught_up(sub, _entries(1, 2), complete=False, generation=sub.generation, now=0.0)
    assert list(followers.catching_up) == [sub]  # the next page is read from 2-0
    followers.deliver("r", _entries(6), now=0.0)
    followers.caught_up(sub, _entries(3, 4, 5), complete=True, generation=sub.generation, now=0.0)
    assert _drain(sub) == _ids(1, 2, 3, 4, 5, 6)


def test_a_catch_up_asked_while_a_read_is_out_needs_a_read_of_its_own() -> None:
    """The delivery stream lost entries while a read was out: that read may have run before they were
    written, so it cannot end the catch-up; a second read does."""
    followers = DeliveryFollowers()
    sub = _follow(followers)
    generation = sub.generation
    followers.catch_up_all(now=0.0)  # a gap seen in the delivery stream
    followers.caught_up(sub, _entries(1), complete=True, generation=generation, now=0.0)
    assert list(followers.catching_up) == [sub]
    followers.deliver("r", _entries(4), now=0.0)  # after the gap
    followers.caught_up(sub, _entries(2, 3), complete=True, generation=sub.generation, now=0.0)
    assert _drain(sub) == _ids(1, 2, 3, 4)
    assert not followers.catching_up


def test_a_live_follower_and_a_replay_of_one_request() -> None:
    """A resume on the gateway that follows the request: the replay reads from the start while the
    first follower stays live; each gets its entries once."""
    followers = DeliveryFollowers()
    live = _follow(followers)
    followers.caught_up(live, [], complete=True, generation=live.generation, now=0.0)
    followers.deliver("r", _entries(1, 2), now=0.0)
    replay = _follow(followers)
    followers.deliver("r", _entries(3), now=0.0)
    assert _drain(live) == _ids(1, 2, 3)
    assert _drain(replay) == []
    followers.caught_up(replay, _entries(1, 2, 3), complete=True, generation=replay.generation, now=0.0)
    followers.deliver("r", _entries(4), now=0.0)
    assert _drain(replay) == _ids(1, 2, 3, 4)
    assert _drain(live) == _ids(4)


def test_a_follower_that_left_during_its_read_gets_nothing() -> None:
    followers = DeliveryFollowers()
    sub = _follow(followers)
    followers.remove(sub)
    assert not followers and not followers.catching_up
    assert not followers.caught_up(sub, _entries(1), complete=True, generation=sub.generation, now=0.0)
    followers.deliver("r", _entries(2), now=0.0)
    assert _drain(sub) == []


def test_quiet_followers_read_their_stream_and_report_what_delivery_missed() -> None:
    followers = DeliveryFollowers()
    sub, other = _follow(followers, "r"), _follow(followers, "o")
    for s in (sub, other):
        followers.caught_up(s, [], complete=True, generation=s.generation, now=0.0)
    followers.deliver("o", _entries(1), now=1.5)
    followers.audit_quiet(now=2.0, quiet_s=2.0)
    assert list(followers.catching_up) == [sub]  # `other` heard something 0.5 s ago
    # Nothing came through the delivery stream, the token stream has an entry: reported.
    assert followers.caught_up(sub, _entries(7), complete=True, generation=sub.generation, now=2.0)
    assert _drain(sub) == _ids(7)
    followers.audit_quiet(now=4.0, quiet_s=2.0)
    followers.deliver("r", _entries(8), now=4.0)  # the delivery stream brings what the read brings
    assert not followers.caught_up(sub, _entries(8), complete=True, generation=sub.generation, now=4.0)
    assert _drain(sub) == _ids(8)
