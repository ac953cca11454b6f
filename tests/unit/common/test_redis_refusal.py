"""Which Redis errors are a refused write (wait and retry) rather than a bug (raise)."""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from common.redis_io.redis_refusal import refuses_writes

OOM = "command not allowed when used memory > 'maxmemory'."


@pytest.mark.parametrize(
    "exc",
    [
        rexc.OutOfMemoryError(OOM),  # redis-py maps the OOM code to this class, dropping the code
        rexc.ReadOnlyError("You can't write against a read only replica."),
        rexc.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's currently unable"),
        rexc.ResponseError(f"Command # 2 (ZADD k 1 m) of pipeline caused error: MISCONF {OOM}"),
        rexc.ResponseError(f"OOM {OOM} script: 712952, on @user_script:1."),
    ],
)
def test_refused_writes(exc: Exception) -> None:
    assert refuses_writes(exc)


@pytest.mark.parametrize(
    "exc",
    [
        rexc.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        rexc.ResponseError("ERR unknown command"),
        rexc.NoScriptError("No matching script."),
        rexc.ConnectionError("Connection refused"),  # an outage: common/redis_io/retry.py
        ValueError("OOM"),
    ],
)
def test_other_errors_are_not_refusals(exc: Exception) -> None:
    assert not refuses_writes(exc)
