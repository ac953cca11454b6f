"""The API keys' configured form, `[name:]<sha256 hex digest>` entries, parsed: what the settings check
at start-up and what `security/api_keys.py` looks keys up in. It sits beneath both, so the settings
import nothing from `security/`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


@dataclass(slots=True, frozen=True)
class KeyHash:
    name: str  # the request owner for requests made with this key
    digest: bytes  # SHA-256 of the key


def parse_key_hashes(entries: Iterable[str], source: str) -> list[KeyHash]:
    """`[name:]hexdigest` entries; blank entries and `#` comments are skipped."""
    keys: list[KeyHash] = []
    for raw in entries:
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        name, _, digest = entry.rpartition(":")
        digest = digest.strip().lower()
        name = name.strip() or f"key-{digest[:8]}"
        if not _HEX_DIGEST.match(digest):
            raise ValueError(
                f"{source}: {raw.strip()!r} is not `[name:]<sha256 hex digest>`; "
                "make one with `python -m gateway hash-key`"
            )
        if not _NAME.match(name):
            raise ValueError(f"{source}: key name {name!r} must be 1-64 of A-Z a-z 0-9 _ . @ -")
        keys.append(KeyHash(name, bytes.fromhex(digest)))
    names = [k.name for k in keys]
    if len(set(names)) != len(names):
        raise ValueError(f"{source}: key names must be unique, got {names}")
    return keys
