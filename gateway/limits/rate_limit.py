"""Per-owner requests- and tokens-per-minute limits, counted in Redis so every gateway shares them;
optionally also per end user of an owner (the request's `safety_identifier`, or `user`), so one
tenant of a shared key cannot use the whole key's budget.

A fixed one-minute window, checked and counted in one Lua script (atomic, and timed by Redis's own
clock so gateways with skewed clocks agree). A refused request is not counted. Tokens are what a
request may cost at most: prompt + max_tokens for every choice, as OpenAI counts them up front.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from common.streams import rate_limit_key
from openai_frontend.protocol.errors import OpenAIError

WINDOW_S = 60

# KEYS[1]: the owner's counter hash {w: window number, r: requests, t: tokens}
# ARGV: rpm, tpm (0: no limit), tokens this request costs, window seconds, and the time in seconds
# where the limiter has a clock of its own (tests), else Redis's TIME is read.
# Returns {allowed (0/1), seconds until the window ends, which limit refused ("requests"/"tokens")}.
_SCRIPT = """
local rpm, tpm, cost, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = tonumber(ARGV[5])
if t == nil then
  local now = redis.call('TIME')
  t = tonumber(now[1]) + tonumber(now[2]) / 1000000
end
local w = math.floor(t / window)
local state = redis.call('HMGET', KEYS[1], 'w', 'r', 't')
local used_r, used_t = 0, 0
if tonumber(state[1]) == w then
  used_r, used_t = tonumber(state[2]) or 0, tonumber(state[3]) or 0
end
local retry = math.max(1, math.ceil((w + 1) * window - t))
if rpm > 0 and used_r + 1 > rpm then return {0, retry, 'requests', used_r} end
if tpm > 0 and used_t + cost > tpm then return {0, retry, 'tokens', used_t} end
redis.call('HSET', KEYS[1], 'w', w, 'r', used_r + 1, 't', used_t + cost)
redis.call('EXPIRE', KEYS[1], 2 * window)
return {1, 0, '', 0}
"""


@dataclass(slots=True, frozen=True)
class RateLimits:
    requests_per_minute: int  # 0: unlimited
    tokens_per_minute: int  # 0: unlimited

    @property
    def enabled(self) -> bool:
        return self.requests_per_minute > 0 or self.tokens_per_minute > 0


class RateLimiter:
    def __init__(
        self, redis: aioredis.Redis, limits: RateLimits, user_limits: RateLimits | None = None
    ) -> None:
        self._limits = limits
        self._user_limits = user_limits or RateLimits(0, 0)
        self._script = redis.register_script(_SCRIPT)
        # None: windows follow Redis's clock. A test sets a clock of its own so that no window ends
        # while it runs.
        self.clock: Callable[[], float] | None = None

    async def check(self, owner: str, num_tokens: int, user: str = "") -> None:
        """Count one request of `num_tokens` for `owner` (and for its end `user` when there are
        per-user limits), or raise a 429 OpenAIError. The end user's limit is checked first: a request
        it refuses costs the key nothing (one the key's limit then refuses has counted for the user)."""
        if user and self._user_limits.enabled:
            await self._check(f"{owner}/{user}", self._user_limits, num_tokens, f" for end user {user!r}")
        await self._check(owner, self._limits, num_tokens, "")

    async def _check(self, counter: str, limits: RateLimits, num_tokens: int, whose: str) -> None:
        if not limits.enabled:
            return
        tpm = limits.tokens_per_minute
        if tpm and num_tokens > tpm:
            # Waiting cannot help: no window ever holds it. No Retry-After, so clients do not retry.
            raise OpenAIError(
                429,
                f"Request too large: it may use {num_tokens} tokens (prompt + max_tokens), over the limit of "
                f"{tpm} tokens per minute. Reduce max_tokens or the prompt.",
                type="tokens",
                code="rate_limit_exceeded",
            )
        reply = await self._script(
            keys=[rate_limit_key(counter)],
            args=[limits.requests_per_minute, tpm, num_tokens, WINDOW_S]
            + ([] if self.clock is None else [self.clock()]),
        )
        allowed, retry_after, kind, used = int(reply[0]), int(reply[1]), _s(reply[2]), int(reply[3])
        if allowed:
            return
        if kind == "requests":
            detail = f"requests per min (RPM): Limit {limits.requests_per_minute}, Used {used}, Requested 1"
        else:
            detail = f"tokens per min (TPM): Limit {tpm}, Used {used}, Requested {num_tokens}"
        raise OpenAIError(
            429,
            f"Rate limit reached{whose} on {detail}. Please try again in {retry_after}s.",
            type=kind,
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry_after)},
        )


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
