"""Who follows which request through a delivery stream, and the handover from a catch-up read.

A follower subscribes at some point of its request's token stream (its start, for a replay), but the
delivery stream only brings what is written from now on. So a new follower first catches up: it
reads its token stream from its position (`openai_frontend/follow/delivery_reader.py` does the reading) and
meanwhile holds what the delivery stream brings for it. When the catch-up read is in, the follower
takes its entries, then the held ones past the last of them: every event written before the read is
in the read, every later one was held, and the token stream entry ids (ascending within a request)
drop what both brought. A follower that missed delivery entries (a gap in the stream), or heard
nothing for a while, catches up again the same way.

This is state only, no I/O: the orders in which reads and deliveries interleave are unit-tested.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from common.redis_conn import entry_key

Entry = tuple[str, dict[bytes, bytes]]  # (token stream entry id, fields)


@dataclass(slots=True, eq=False)
class Subscription:
    req_id: str
    last_id: str  # the newest entry already delivered (or the resume point)
    queue: asyncio.Queue[list[Entry]] = field(default_factory=asyncio.Queue)
    # Through a delivery stream only: entries held while a catch-up read is out (None: not catching up).
    held: list[Entry] | None = None
    heard_at: float = 0.0  # time.monotonic() of its last entry, or of its last catch-up
    audit: bool = False  # its catch-up checks that the delivery stream brought everything
    read_ids: list[str] = field(default_factory=list)  # what an audit's read brought first
    # Bumped by every catch-up asked for: a read asked for before the last one does not complete it.
    generation: int = 0


def put(sub: Subscription, entries: list[Entry]) -> None:
    """Give `sub` the entries past its position, in order."""
    after = entry_key(sub.last_id)
    new = [e for e in entries if entry_key(e[0]) > after]
    if new:
        sub.last_id = new[-1][0]
        sub.queue.put_nowait(new)


class DeliveryFollowers:
    def __init__(self) -> None:
        self._subs: dict[str, list[Subscription]] = {}  # by req_id
        self.catching_up: dict[Subscription, None] = {}  # in order: the catch-up reads to make

    def __bool__(self) -> bool:
        return bool(self._subs)

    def add(self, sub: Subscription, now: float) -> None:
        self._subs.setdefault(sub.req_id, []).append(sub)
        self.catch_up(sub, now)

    def remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.req_id, [])
        if sub in subs:
            subs.remove(sub)
        if not subs:
            self._subs.pop(sub.req_id, None)
        self.catching_up.pop(sub, None)

    def catch_up(self, sub: Subscription, now: float, *, audit: bool = False) -> None:
        """Hold `sub`'s deliveries until a read of its token stream from its position is in."""
        if sub.held is None:
            sub.held = []
        sub.generation += 1
        sub.audit = audit
        sub.heard_at = now
        self.catching_up[sub] = None

    def catch_up_all(self, now: float) -> None:
        """The delivery stream lost entries: every follower reads its token stream again."""
        for subs in self._subs.values():
            for sub in subs:
                self.catch_up(sub, now)

    def audit_quiet(self, now: float, quiet_s: float) -> None:
        """Followers that heard nothing for `quiet_s` check their token stream (a writer that does not
        deliver, such as a worker older than this gateway, leaves them waiting otherwise)."""
        for subs in self._subs.values():
            for sub in subs:
                if sub.held is None and now - sub.heard_at >= quiet_s:
                    self.catch_up(sub, now, audit=True)

    def deliver(self, req_id: str, entries: list[Entry], now: float) -> None:
        """Entries of `req_id` read from the delivery stream."""
        for sub in self._subs.get(req_id, ()):
            if sub.held is not None:
                sub.held.extend(entries)
            else:
                sub.heard_at = now
                put(sub, entries)

    def caught_up(
        self, sub: Subscription, entries: list[Entry], *, complete: bool, generation: int, now: float
    ) -> bool:
        """A catch-up read of `sub`'s token stream, asked for at `generation`, came in (`complete`: it
        reached the stream's end). It completes the catch-up unless a later one was asked for meanwhile
        (events lost after the read began) or it was a page of several: then the next read follows.
        True when an audit found entries the delivery stream had not brought."""
        if sub not in self.catching_up or sub.held is None:
            return False  # unsubscribed while the read was out
        before = sub.last_id
        put(sub, entries)
        if sub.audit and sub.last_id != before:
            sub.read_ids += [e[0] for e in entries if entry_key(e[0]) > entry_key(before)]
        if not complete or generation != sub.generation:
            return False
        held, sub.held = sub.held, None
        self.catching_up.pop(sub, None)
        put(sub, held)
        missed = bool(set(sub.read_ids) - {e[0] for e in held})
        sub.audit, sub.read_ids = False, []
        sub.heard_at = now
        return missed
