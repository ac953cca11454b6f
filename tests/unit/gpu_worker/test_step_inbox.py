"""The worker loop's inbox (gpu_worker/service/step_inbox.py): steps in order from the stream it
follows, a watched step's device end as soon as it comes, and a failed thread raised in the loop.
The Redis read is a function here; tests/stack/services/test_worker_service.py runs it on Redis."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence

import pytest

from gpu_worker.runner.step.launched import StepHandle
from gpu_worker.runner.step.sampling import LaunchedSample, SampledStep
from gpu_worker.service.step_inbox import DeviceDone, StepInbox, StepMessage

Entries = Sequence[tuple[str, bytes | None]]


class Stream:
    """Entries appended by the test, read as a blocking XREAD would read them (by stream and id)."""

    def __init__(self) -> None:
        self._entries: dict[str, list[tuple[str, bytes | None]]] = {}
        self._changed = threading.Condition()

    def add(self, stream: str, entry_id: str, message: bytes) -> None:
        with self._changed:
            self._entries.setdefault(stream, []).append((entry_id, message))
            self._changed.notify_all()

    def read(self, stream: str, after_id: str) -> Entries:
        with self._changed:
            self._changed.wait_for(lambda: bool(self._after(stream, after_id)), timeout=0.05)
            return self._after(stream, after_id)

    def _after(self, stream: str, after_id: str) -> Entries:
        return [(i, m) for i, m in self._entries.get(stream, []) if int(i) > int(after_id)]


@pytest.fixture()
def stream() -> Stream:
    return Stream()


@pytest.fixture()
def inbox(stream: Stream) -> Iterator[StepInbox]:
    box = StepInbox(stream.read, "steps:a", "0")
    yield box
    box.stop()


def next_item(inbox: StepInbox) -> StepMessage | DeviceDone:
    item = inbox.get(timeout=10)
    assert item is not None, "nothing came within 10 s"
    return item


def test_steps_come_in_order_from_the_stream_followed(stream: Stream, inbox: StepInbox) -> None:
    stream.add("steps:a", "1", b"one")
    stream.add("steps:a", "2", b"two")
    assert [next_item(inbox), next_item(inbox)] == [
        StepMessage("steps:a", "1", b"one"),
        StepMessage("steps:a", "2", b"two"),
    ]
    inbox.follow("steps:b", "0")  # the worker rejoined under a new id
    stream.add("steps:b", "1", b"three")
    item = next_item(inbox)
    while isinstance(item, StepMessage) and item.stream == "steps:a":
        item = next_item(inbox)  # none is left of the old stream, but one read may have been under way
    assert item == StepMessage("steps:b", "1", b"three")


def test_a_watched_step_comes_back_when_its_device_work_ends(inbox: StepInbox) -> None:
    device_done = threading.Event()

    def wait() -> None:
        device_done.wait()

    sample = LaunchedSample(None, device_done.is_set, wait, lambda: SampledStep([], {}, {}, {}))
    handle = StepHandle(sample, lambda: pytest.fail("the inbox only waits; the loop finishes the step"))
    inbox.watch(handle)
    assert inbox.get(timeout=0.2) is None and not handle.ready()
    device_done.set()
    assert next_item(inbox) == DeviceDone(handle)


def test_a_read_that_fails_stops_the_loop_with_its_error() -> None:
    failures: queue.Queue[BaseException] = queue.Queue()
    failures.put(ValueError("a reply the worker cannot read"))

    def read(stream: str, after_id: str) -> Entries:
        raise failures.get()

    box = StepInbox(read, "steps:a", "0")
    try:
        with pytest.raises(RuntimeError, match="step inbox failed") as raised:
            box.get(timeout=10)
        assert isinstance(raised.value.__cause__, ValueError)
    finally:
        box.stop()
