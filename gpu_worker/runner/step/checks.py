"""Checks of a step's diff against what the worker holds: each returns an error, or None if it may run.

A request that fails a check is dropped alone and reported in `req_errors`; the rest of the step runs.
"""

from __future__ import annotations

from common.protocol import CachedRequestData, NewRequestData
from gpu_worker.runner.cached_request_state import CachedRequestState


def check_new(new: NewRequestData, vocab_size: int, max_model_len: int, num_blocks: int) -> str | None:
    num_tokens = len(new.prompt_token_ids) + len(new.output_token_ids)
    if not new.prompt_token_ids:
        return "empty prompt"
    bad = [t for t in (*new.prompt_token_ids, *new.output_token_ids) if not 0 <= t < vocab_size]
    if bad:
        return f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})"
    params = new.sampling_params
    bad = [t for t in (*params.logit_bias, *params.stop_token_ids) if not 0 <= t < vocab_size]
    if bad:
        return f"sampling parameter token id {bad[0]} is outside the vocabulary"
    if num_tokens > max_model_len:
        return f"{num_tokens} tokens exceed max_model_len {max_model_len}"
    if params.prompt_logprobs is not None and not new.output_token_ids and new.num_computed_tokens:
        return "prompt_logprobs need the whole prompt computed, but it came with cached tokens"
    if not 0 <= new.num_computed_tokens < num_tokens:
        return f"num_computed_tokens {new.num_computed_tokens} out of range for {num_tokens} tokens"
    return check_blocks(new.block_ids, num_blocks)


def check_cached(cached: CachedRequestData, state: CachedRequestState | None, num_blocks: int) -> str | None:
    if state is None:
        return "unknown request: it was never sent to this worker as new, or was freed"
    if state.finish_reason is not None:
        return None  # async scheduling sent it once more before learning it ended: skipped later
    if cached.num_computed_tokens != state.num_computed_tokens:
        return (
            f"num_computed_tokens mismatch: batcher says {cached.num_computed_tokens}, "
            f"worker has {state.num_computed_tokens}"
        )
    return check_blocks(cached.new_block_ids, num_blocks)


def check_blocks(block_ids: list[int], num_blocks: int) -> str | None:
    bad = [b for b in block_ids if not 0 <= b < num_blocks]
    return f"block id {bad[0]} outside the pool (0..{num_blocks - 1})" if bad else None


def check_scheduled(
    state: CachedRequestState | None, num_tokens: int, block_size: int, num_drafts: int = 0
) -> str | None:
    if state is None:
        return "scheduled but unknown to this worker"
    end = state.num_computed_tokens + num_tokens
    if num_tokens < 1 or end > state.num_tokens + num_drafts:
        return (
            f"scheduled {num_tokens} tokens from {state.num_computed_tokens}, "
            f"but only {state.num_tokens} are known"
        )
    if num_drafts and end != state.num_tokens + num_drafts:
        return "drafts scheduled without every known token before them"
    if end > len(state.block_ids) * block_size:
        return f"{end} tokens need more than the {len(state.block_ids)} blocks allocated"
    return None
