"""Automatic prefix caching (vLLM's hashed blocks): which of a request's blocks a worker already has.

Each full block of a sequence is named by a hash chained on its parent block's hash and its own
token ids, plus the extra keys that change its KV (a LoRA adapter's `cache_key`: an adapter's KV
is not the base model's; the identifiers of the images whose placeholder tokens fall in the block:
the same text with another image is not a hit), so equal hashes mean equal KV. A
request admitted on a worker takes the blocks of its longest cached prefix, always leaving at least
one token to compute (its logits give the next token); the cached length is whole blocks, so new
KV never lands in a shared block. Blocks become findable as soon as a step that computes them is
sent: the worker writes a step's KV before any attention of that step reads it, so a request
admitted in the same step can already share them.
This file names the blocks; kv_cache_manager.py looks them up, takes them and makes them findable.
"""

from __future__ import annotations

from batcher.core.request import Request
from common.block_hash import hash_block


def block_hashes(req: Request, block_size: int) -> list[bytes]:
    """The hashes of every full block of `req`'s known tokens (kept on the request, extended as
    its tokens grow; recomputed for a worker with another block size)."""
    if req.hash_block_size != block_size:
        req.block_hashes, req.hash_block_size = [], block_size
    hashes = req.block_hashes
    num_full = req.num_tokens // block_size
    if len(hashes) < num_full:
        tokens = req.prompt_token_ids + req.output_token_ids
        for i in range(len(hashes), num_full):
            parent = hashes[i - 1] if i else None
            extra_keys = block_extra_keys(req, i * block_size, (i + 1) * block_size)
            hashes.append(hash_block(parent, tokens[i * block_size : (i + 1) * block_size], extra_keys))
    return hashes


def block_extra_keys(req: Request, start: int, end: int) -> bytes:
    """What besides its tokens shapes the KV of `req`'s tokens [start, end): its adapter, and the
    images whose placeholder tokens fall there (vLLM's `_gen_mm_extra_hash_keys`)."""
    keys = req.lora_key or b""
    for feature in req.mm_features or ():
        offset, length = feature.mm_position.offset, feature.mm_position.length
        if offset < end and offset + length > start:
            keys += b"|image:" + feature.identifier.encode()
    return keys


def max_cached_blocks(req: Request, block_size: int) -> int:
    """The most blocks `req` may take from a cache when admitted."""
    # Whole blocks only, and at least one token left to compute; none for a request whose prompt
    # logprobs come from this forward (recomputed with its output, it no longer needs them).
    if req.sampling_params.prompt_logprobs is not None and not req.output_token_ids:
        return 0
    return (req.num_tokens - 1) // block_size
