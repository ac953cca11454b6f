"""Redis commands packed once, by hiredis, for the per-step hot path.

redis-py runs every argument through its Encoder and builds its own tuples before hiredis packs them;
a step's publish carries three arguments per token. `hiredis.pack_command` takes bytes, str, int and
float as they are, and several commands packed together go out in one write (raw_command.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias, cast

import hiredis

Arg: TypeAlias = bytes | str | int | float


def pack(*args: Arg) -> bytes:
    """One command (its name first) in the Redis protocol."""
    return hiredis.pack_command(cast(Any, args))  # its stubs type the tuple as of one element


def pack_all(commands: Iterable[Sequence[Arg]]) -> bytes:
    """Several commands, to be sent as one write and answered in order (a pipeline)."""
    return b"".join([pack(*command) for command in commands])
