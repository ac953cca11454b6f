"""A Redis that answers but refuses writes: full (`OOM` under `maxmemory` with `noeviction`), a
read-only replica (`READONLY`), a failed RDB save with `stop-writes-on-bgsave-error` (`MISCONF`).

Not an outage (common/redis_io/retry.py): the data is still there and reads still work, so a service keeps its
state and retries the refused writes until Redis takes them again, instead of exiting or rebuilding.
`LOADING` (a restarted Redis reading its AOF) is a `BusyLoadingError`, a ConnectionError: an outage.
Deletes, acks and trims are not refused when Redis is full (only commands that may grow memory are),
so freeing memory keeps working while a service waits.
"""

from __future__ import annotations

import redis.exceptions

# Each refusal's error code, the first word of Redis' reply. A script's refused write carries the code
# of the command inside it ("OOM command not allowed ... script: ...").
_CODES = ("OOM", "READONLY", "MISCONF")


def refuses_writes(exc: BaseException) -> bool:
    """True when `exc` is Redis refusing a write it would otherwise take."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError | redis.exceptions.ReadOnlyError):
        return True
    if not isinstance(exc, redis.exceptions.ResponseError):
        return False
    message = str(exc)
    # A pipeline run with raise_on_error prefixes "Command # 2 (...) of pipeline caused error: ".
    head = message.rsplit("caused error: ", 1)[-1]
    return head.startswith(_CODES)


class RedisRefusesWrites(Exception):
    """Raised by a service's loop when Redis refused one of its writes; the refused ones are kept."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause
