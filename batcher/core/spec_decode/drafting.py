"""Which running requests draft in a step, and how many tokens (the drafts count in the step's
token budget and blocks like any other token; the worker verifies them). Any request may draft: the
worker samples each draft's position as a plain step would sample it there, with the drafts before
it taken as output (logit_bias, min_tokens, penalties, a grammar), and reports the logprobs of each
token of the run (gpu_worker/runner/spec_decode/verify.py), so speculation changes no output."""

from __future__ import annotations

from batcher.core.request import Request
from batcher.core.spec_decode.ngram_proposer import propose_ngram
from batcher.core.spec_decode.suffix_cache import SuffixCache
from common.finish import num_samples_left
from common.spec_decode.speculative_config import SpeculativeConfig


def adapt_num_spec_tokens(config: SpeculativeConfig, req: Request, num_accepted: int) -> None:
    """transformers' assisted-generation heuristic: two more drafts after a step that accepted all,
    one fewer (at least one) after a rejection, so a request that drafts badly wastes little."""
    current = req.num_spec_tokens or config.num_draft_tokens
    if num_accepted == len(req.spec_token_ids):
        req.num_spec_tokens = min(current + 2, config.num_draft_tokens)
    else:
        req.num_spec_tokens = max(current - 1, 1)


def num_drafts_to_ask(config: SpeculativeConfig, req: Request) -> int:
    """draft_model: how many drafts the worker makes for `req` after the step being planned, for
    the step after it (0: none)."""
    if config.method != "draft_model":
        return 0
    return req.num_spec_tokens or config.num_draft_tokens


def make_suffix_cache(config: SpeculativeConfig | None) -> SuffixCache | None:
    """The recent requests suffix decoding searches (one per batcher: drafts need no worker's KV)."""
    if config is None or config.method != "suffix":
        return None
    return SuffixCache(
        config.suffix_decoding_max_cached_requests,
        config.suffix_decoding_max_tree_depth,
        config.suffix_decoding_max_spec_factor,
    )


def propose_drafts(
    config: SpeculativeConfig,
    req: Request,
    budget: int,
    max_model_len: int,
    suffix_cache: SuffixCache | None = None,
) -> list[int]:
    """Drafts for `req`'s next decode, within `budget` tokens for the whole of it; [] when it should
    not draft. Never more than it could still output, nor past `max_model_len`."""
    if not req.output_token_ids or req.num_output_placeholders:
        return []
    k = min(
        req.num_spec_tokens or config.num_draft_tokens,
        budget - 1,  # its last known token is computed too
        # The bonus token comes on top.
        num_samples_left(len(req.output_token_ids), req.num_tokens, req.sampling_params, max_model_len) - 1,
    )
    if k <= 0:
        return []
    if config.method == "draft_model":
        return req.draft_token_ids[:k]  # the worker's, made after the step that ended at its last token
    return lookup(config, req, k, suffix_cache)


def lookup(config: SpeculativeConfig, req: Request, k: int, suffix_cache: SuffixCache | None) -> list[int]:
    """Up to `k` model-free drafts following `req`'s known tokens."""
    tokens = req.prompt_token_ids + req.output_token_ids
    if suffix_cache is not None:
        return suffix_cache.propose(tokens, k)
    return propose_ngram(tokens, config.prompt_lookup_min, config.prompt_lookup_max, k)
