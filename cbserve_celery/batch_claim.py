"""The claim of the one task running a batch: a key holding the task's token, with a TTL it renews.

Celery can hold two tasks for one batch at once (a redelivered one beside its continuation); only the
holder runs lines, so no line is followed, written or finalized by two tasks. A holder that dies
stops renewing, and the next task gets the claim once the TTL has run out. A task whose run Redis
failed runs again under the same token, so it takes back a claim that outlived the outage at once.
"""

from __future__ import annotations

import secrets

import redis.asyncio as aioredis

from common.redis_io.lease_scripts import RELEASE, RENEW


def new_claim_token() -> str:
    """One per task: its runs of the batch share it."""
    return secrets.token_hex(8)


class BatchClaim:
    def __init__(self, redis: aioredis.Redis, key: str, ttl_s: float, token: str) -> None:
        self._redis = redis
        self._key = key
        self._ttl_ms = int(ttl_s * 1000)
        self._token = token

    async def acquire(self) -> bool:
        """Take the claim, or keep it when it is ours already (its release was lost with Redis)."""
        if await self._redis.set(self._key, self._token, nx=True, px=self._ttl_ms):
            return True
        return await self.renew()

    async def renew(self) -> bool:
        """False when the claim expired and another task may hold it: stop at once."""
        return bool(await self._redis.eval(RENEW, 1, self._key, self._token, self._ttl_ms))

    async def release(self) -> None:
        await self._redis.eval(RELEASE, 1, self._key, self._token)
