"""The name of a block of tokens: a hash chained on its parent block's, so it stands for the whole
prefix up to it. The batcher's prefix cache names KV blocks so (batcher/core/kv/prefix_cache.py), and the
gateway's cell router names the prompts it placed the same way (gateway/prefix_index.py)."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

# Extra keys are hashed into every block: a bump here keeps old caches from matching new formats.
HASH_VERSION = b"cbserve-kv-1"


def hash_block(parent: bytes | None, token_ids: Sequence[int], extra_keys: bytes = b"") -> bytes:
    """The name of a block's KV: its parent's hash, its tokens and whatever else shapes the KV."""
    h = hashlib.blake2b(parent or HASH_VERSION, digest_size=16)
    h.update(array("q", token_ids).tobytes())
    if extra_keys:
        h.update(extra_keys)
    return h.digest()
