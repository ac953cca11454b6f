"""Overload protection: refuse new requests (429 + Retry-After) while too many already wait.

Waiting = requests on the requests stream that no batcher has claimed yet (the entries after the
consumer group's last delivered id, counted up to the bound: not the group's `lag`, which a Redis
restart can leave stale, see _READ) plus the interactive ones the batcher holds in its waiting queue
(`num_waiting_interactive` in its stats hash, published again by a batcher after every (re)start and
Redis outage): waiting Batch API lines do not count, since they are admitted only after every
waiting interactive request. Several gateways read the same numbers, so the bound is shared, though
soft: gateways admitting at the same instant can overshoot it by a few requests.

Within one gateway the count is exact. The requests it admitted and has not released count too: a
burst whose checks all read the queue before any of them was written would otherwise pass the bound
together (20 was overshot to 106 by one gateway). Whether one of them is already on the stream, and
so counted as unclaimed, is asked in the same atomic reading (its submit marker), so a request written while a
check is in flight is counted once, not twice (a bound of 2 refused the second of two requests).
Requests admitted after a reading was sent are counted by it whatever it shows: that reading cannot
have asked about them, and may have seen them on the stream too. So a check whose reading saw
admissions in flight reads again, and only the last of a few readings keeps that conservative count.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from common.streams import BATCHER_GROUP, CellKeys, submitted_key
from openai_frontend.protocol.errors import OpenAIError

log = logging.getLogger(__name__)

# A queue that is full now is usually not empty a second later; clients back off and try again.
RETRY_AFTER_S = 2

# One atomic reading, so that no submit (a script too) falls between its parts. KEYS: the requests
# stream, the batcher's stats hash, then submit markers. ARGV: the batcher group's name, and how many
# unclaimed entries to count at most (past the bound, the exact number does not matter).
# Returns {unclaimed, waiting interactive, how many of the markers exist, the group's lag or -1}.
# Unclaimed entries are counted where they are, after the group's last delivered id, not taken from
# its `lag`: Redis 7.0 replays a claim from the AOF (XCLAIM ... LASTID) without its read counter, so
# after a restart the lag keeps counting every entry claimed since the last AOF rewrite, for ever.
_READ = """
local after = '-'
local lag = -1
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
if ok then
  for _, group in ipairs(groups) do
    local fields = {}
    for i = 1, #group, 2 do fields[group[i]] = group[i + 1] end
    if fields['name'] == ARGV[1] then
      after = '(' .. fields['last-delivered-id']
      lag = fields['lag'] or -1
    end
  end
end
local unclaimed = #redis.call('XRANGE', KEYS[1], after, '+', 'COUNT', tonumber(ARGV[2]))
local waiting = tonumber(redis.call('HGET', KEYS[2], 'num_waiting_interactive') or 0)
local written = 0
for i = 3, #KEYS do written = written + redis.call('EXISTS', KEYS[i]) end
return {unclaimed, math.floor(waiting), written, lag}
"""
# Readings a check takes at most while other requests are admitted during them; the last one counts
# those conservatively (a burst may then be refused a little early, never let past the bound).
_READ_ATTEMPTS = 3
# A stale lag is logged, at most this often: the count above does not depend on it.
_LAG_WARNING_INTERVAL_S = 60.0


@dataclass(frozen=True, slots=True)
class QueueReading:
    num_queued: int  # the cell's waiting interactive requests, as Redis counts them
    num_written: int  # of the choices asked about, those already on the stream
    num_unclaimed: int  # on the stream after the batcher group's last delivered id (at most the cap)
    lag: int | None  # the group's own count of those (None: no group, or Redis could not tell)


async def read_queue(
    redis: aioredis.Redis, keys: CellKeys, choice_ids: list[str], max_unclaimed: int
) -> QueueReading:
    """The interactive requests waiting in the cell of `keys` (unclaimed ones counted up to
    `max_unclaimed`), and how many of `choice_ids` (requests of that cell) Redis holds already."""
    markers = [submitted_key(choice_id) for choice_id in choice_ids]
    unclaimed, waiting, written, lag = await redis.eval(
        _READ, 2 + len(markers), keys.requests, keys.stats, *markers, BATCHER_GROUP, max_unclaimed
    )
    return QueueReading(
        int(unclaimed) + int(waiting), int(written), int(unclaimed), None if int(lag) < 0 else int(lag)
    )


@dataclass(slots=True)
class _Admitted:
    number: int  # in admission order
    choice_ids: list[str]


@dataclass(slots=True)
class _Unseen:
    """One cell's requests this gateway admitted and has not released (released once written or
    refused), and what a reading in flight must add to what Redis shows it."""

    admitted: dict[str, _Admitted] = field(default_factory=dict)  # by req_id
    num_admitted: int = 0
    # Released while a reading sent before their admission was in flight: (admission number, choices).
    late: list[tuple[int, int]] = field(default_factory=list)
    readings: Counter[int] = field(default_factory=Counter)  # in flight: admissions before each began

    def begin_reading(self) -> tuple[int, list[str]]:
        """A reading is sent: its admission number, and the choices it asks Redis about."""
        self.readings[self.num_admitted] += 1
        return self.num_admitted, [c for a in self.admitted.values() for c in a.choice_ids]

    def end_reading(self, began: int, num_asked: int, num_written: int) -> int:
        """The reading that began at admission `began`, which found `num_written` of the `num_asked`
        choices it asked about on the stream, is answered: what it does not show."""
        num = num_asked - num_written
        num += sum(len(a.choice_ids) for a in self.admitted.values() if a.number > began)
        num += sum(n for at, n in self.late if at > began)
        self.readings[began] -= 1
        if self.readings[began] == 0:
            del self.readings[began]
        oldest = min(self.readings, default=self.num_admitted)
        self.late = [(at, n) for at, n in self.late if at > oldest]
        return num

    def admit(self, req_id: str, choice_ids: list[str]) -> None:
        self.num_admitted += 1
        self.admitted[req_id] = _Admitted(self.num_admitted, choice_ids)

    def release(self, req_id: str) -> None:
        admitted = self.admitted.pop(req_id, None)
        if admitted is not None and min(self.readings, default=admitted.number) < admitted.number:
            self.late.append((admitted.number, len(admitted.choice_ids)))


@dataclass(slots=True)
class QueueBound:
    """GATEWAY_MAX_QUEUED_REQUESTS for one gateway: what Redis says waits, plus what it admitted and
    Redis does not show yet."""

    max_queued: int  # 0: no bound
    _unseen: dict[str, _Unseen] = field(default_factory=dict)  # by cell
    _lag_warned_at: float = float("-inf")

    async def check(self, redis: aioredis.Redis, keys: CellKeys, req_id: str, choice_ids: list[str]) -> None:
        """Raise 429 when admitting `req_id`'s requests (`choice_ids`, one per choice) would exceed the
        bound; else count them as waiting until `release(req_id)`."""
        if self.max_queued <= 0:
            return
        unseen = self._unseen.setdefault(keys.cell, _Unseen())
        for attempt in range(_READ_ATTEMPTS):
            began, asked = unseen.begin_reading()
            try:
                reading = await read_queue(redis, keys, asked, self.max_queued + 1)
            except BaseException:
                unseen.end_reading(began, len(asked), 0)
                raise
            not_shown = unseen.end_reading(began, len(asked), reading.num_written)
            # A request admitted while the reading was in flight is counted by it whatever it shows
            # (it could not ask about it): written before the reading ran, it counts twice, and a
            # bound of 2 refused the second of two requests. A reading with none is exact.
            if unseen.num_admitted == began or attempt == _READ_ATTEMPTS - 1:
                break
        self._check_lag(keys.cell, reading)
        # No await from here on: the count and the admission are one step for this gateway.
        queued = reading.num_queued + not_shown
        if queued + len(choice_ids) > self.max_queued:
            raise OpenAIError(
                429,
                f"The server is overloaded: {queued} requests are waiting (limit {self.max_queued}). "
                f"Please retry after {RETRY_AFTER_S}s.",
                type="server_overloaded",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        unseen.admit(req_id, choice_ids)

    def _check_lag(self, cell: str, reading: QueueReading) -> None:
        """Warn when the group's lag disagrees with the entries counted (a counted number is exact
        below the cap): operators who read XINFO GROUPS should know not to trust it."""
        if reading.lag is None or reading.lag == reading.num_unclaimed:
            return
        if reading.num_unclaimed > self.max_queued and reading.lag > self.max_queued:
            return  # both past the cap, where the count stops
        now = time.monotonic()
        if now - self._lag_warned_at >= _LAG_WARNING_INTERVAL_S:
            self._lag_warned_at = now
            log.warning(
                "cell %s: the batcher group's lag is %d but %d requests are unclaimed; counting those "
                "(a lag left stale by a Redis restart from its AOF)",
                cell,
                reading.lag,
                reading.num_unclaimed,
            )

    def release(self, cell: str, req_id: str) -> None:
        """`req_id` was written (or refused after all): Redis counts it in readings sent from now on."""
        if cell in self._unseen:
            self._unseen[cell].release(req_id)
