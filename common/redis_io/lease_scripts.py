"""Lua scripts for a lease key holding its holder's value with a TTL (the batcher's, a batch task's).

Renew and release act only on a lease that still holds the caller's value, so a holder that lost it
(paused past the TTL) can neither extend nor delete the next holder's lease.
"""

from __future__ import annotations

from typing import Final

# KEYS: lease. ARGV: our lease value, TTL (ms).
RENEW: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: lease. ARGV: our lease value.
RELEASE: Final = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""
