"""API keys: SHA-256 digests from the settings, and a constant-time lookup of a presented key.

Only digests are configured, so a leaked config file or environment does not leak usable keys. A key
is identified by its name (or, without one, `key-` + the first 8 hex digits of its digest): that name
is the request's `owner`, and the key itself goes nowhere.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass

_HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def hash_key(key: str) -> str:
    """The hex digest to configure for `key` (what `printf %s KEY | sha256sum` prints)."""
    return hashlib.sha256(key.encode()).hexdigest()


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


class ApiKeys:
    def __init__(self, keys: list[KeyHash]) -> None:
        self._keys = keys

    @classmethod
    def from_settings(cls, hashes: str, keys_file: str | None) -> ApiKeys:
        keys = parse_key_hashes(hashes.split(","), "GATEWAY_API_KEY_HASHES")
        if keys_file is not None:
            with open(keys_file) as f:
                keys += parse_key_hashes(f.read().splitlines(), f"GATEWAY_API_KEYS_FILE {keys_file}")
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def owner_of(self, key: str) -> str | None:
        """The name of the configured key equal to `key`, or None.

        Digests are compared with `hmac.compare_digest`, and every configured key is compared whatever
        matched, so timing says nothing about the key or which one it was close to.
        """
        digest = hashlib.sha256(key.encode()).digest()
        owner: str | None = None
        for k in self._keys:
            if hmac.compare_digest(digest, k.digest):
                owner = k.name
        return owner
