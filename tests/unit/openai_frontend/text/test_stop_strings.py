"""Stop strings: cut before the first match, never show part of one while streaming."""

from __future__ import annotations

from openai_frontend.text.stop_strings import StopStringMatcher


def _feed(matcher: StopStringMatcher, deltas: list[str]) -> list[str]:
    shown = []
    for delta in deltas:
        matcher.append(delta)
        shown.append(matcher.take(final=matcher.stopped))
    return shown


def test_match_across_deltas_is_cut_and_never_shown() -> None:
    matcher = StopStringMatcher(["STOP"])
    shown = _feed(matcher, ["Hello S", "T", "O", "P and more"])
    assert matcher.stopped
    assert matcher.text == "Hello "
    assert "".join(shown) == "Hello "
    assert all("S" not in s for s in shown)


def test_held_back_tail_is_released_when_no_match() -> None:
    matcher = StopStringMatcher(["STOP"])
    shown = _feed(matcher, ["abc", "ST", "x"])
    assert not matcher.stopped
    # The last len("STOP") - 1 characters wait for the next token.
    assert "".join(shown) == "abc"
    assert matcher.take(final=True) == "STx"
    assert matcher.text == "abcSTx"


def test_earliest_match_wins() -> None:
    matcher = StopStringMatcher(["world", "o w"])
    assert matcher.append("hello world")
    assert matcher.text == "hell"


def test_match_inside_a_single_delta() -> None:
    matcher = StopStringMatcher(["\n\n"])
    assert matcher.append("first paragraph\n\nsecond")
    assert matcher.take(final=True) == "first paragraph"


def test_no_stop_strings_hold_nothing_back() -> None:
    matcher = StopStringMatcher([])
    assert _feed(matcher, ["a", "b", "c"]) == ["a", "b", "c"]


def test_text_after_stop_is_ignored() -> None:
    matcher = StopStringMatcher(["x"])
    assert matcher.append("ax")
    assert matcher.append("more")
    assert matcher.text == "a"
