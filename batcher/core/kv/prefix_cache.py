"""Automatic prefix caching (vLLM's hashed blocks): which of a request's blocks a worker already has.

Each full block of a sequence is named by a hash chained on its parent block's hash and its own
token ids, plus the extra keys that change its KV (none yet; adapters and multimodal inputs will
add theirs), so equal hashes mean equal KV. A request admitted on a worker takes the blocks of its
longest cached prefix, always leaving at least one token to compute (its logits give the next
token); the cached length is whole blocks, so new KV never lands in a shared block. Blocks become
findable as soon as a step that computes them is sent: the worker writes a step's KV before any
attention of that step reads it, so a request admitted in the same step can already share them.
"""

from __future__ import annotations

from dataclasses import dataclass

from batcher.core.kv.block_manager import BlockManager
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
            hashes.append(hash_block(parent, tokens[i * block_size : (i + 1) * block_size]))
    return hashes


@dataclass(slots=True)
class Admission:
    """What admitting a waiting request on a worker takes, before anything is taken."""

    cached_block_ids: list[int]  # its longest cached prefix on that worker
    num_cached_tokens: int  # tokens those blocks hold: computed without computing them
    num_new_tokens: int  # tokens to compute in the admitting step
    num_free_blocks_needed: int  # new blocks plus cached ones nobody held until now


def max_cached_blocks(req: Request, block_size: int) -> int:
    """The most blocks `req` may take from a cache when admitted."""
    # Whole blocks only, and at least one token left to compute; none for a request whose prompt
    # logprobs come from this forward (recomputed with its output, it no longer needs them).
    if req.sampling_params.prompt_logprobs is not None and not req.output_token_ids:
        return 0
    return (req.num_tokens - 1) // block_size


def cached_prefix_blocks(bm: BlockManager, req: Request) -> list[int]:
    """The blocks of `req`'s longest cached prefix in `bm` that admitting it would take."""
    max_blocks = max_cached_blocks(req, bm.block_size)
    return bm.cached_prefix(block_hashes(req, bm.block_size), max_blocks) if max_blocks else []


def plan_admission(bm: BlockManager, req: Request, budget: int) -> Admission:
    """Admitting `req` with up to `budget` tokens computed in this step."""
    cached = cached_prefix_blocks(bm, req)
    num_cached = len(cached) * bm.block_size
    num_new = min(req.num_tokens - num_cached, budget)
    need = bm.num_new_blocks(len(cached), num_cached + num_new) + bm.num_unheld(cached)
    return Admission(cached, num_cached, num_new, need)


def cache_computed_blocks(bm: BlockManager, req: Request, num_computed_tokens: int) -> None:
    """Make `req`'s full blocks up to `num_computed_tokens` findable (once the step computing them
    is sent). Tokens not yet known (sampled by a step in flight) wait for a later step."""
    if not bm.enable_caching:
        return
    num_full = min(num_computed_tokens, req.num_tokens) // bm.block_size
    if num_full <= req.num_cached_blocks:
        return
    hashes = block_hashes(req, bm.block_size)
    for i in range(req.num_cached_blocks, num_full):
        bm.cache(req.block_ids[i], hashes[i])
    req.num_cached_blocks = num_full
