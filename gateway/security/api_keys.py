"""API keys: SHA-256 digests from the settings, and a constant-time lookup of a presented key.

Only digests are configured, so a leaked config file or environment does not leak usable keys. A key
is identified by its name (or, without one, `key-` + the first 8 hex digits of its digest): that name
is the request's `owner`, and the key itself goes nowhere.
"""

from __future__ import annotations

import hashlib
import hmac

from gateway.key_hashes import KeyHash, parse_key_hashes


def hash_key(key: str) -> str:
    """The hex digest to configure for `key` (what `printf %s KEY | sha256sum` prints)."""
    return hashlib.sha256(key.encode()).hexdigest()


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
