"""Finish decisions from token ids, shared so that the worker that ends a request and the batcher
that plans its steps decide the same way: the length bound lives here alone."""

from __future__ import annotations

from collections.abc import Collection

from common.protocol import FinishReason, SamplingParams


def max_samples(params: SamplingParams) -> int:
    """The most tokens a request samples: `max_tokens`, and one when it generates nothing
    (max_tokens 0), sampled at the end of its prompt to end there (never shown)."""
    return max(1, params.max_tokens)


def num_samples_left(
    num_output_tokens: int, num_tokens: int, params: SamplingParams, max_model_len: int
) -> int:
    """How many more tokens a request of `num_output_tokens` sampled (`num_tokens` with its prompt)
    may sample before the length bound ends it (its max_tokens, or the model's context); <= 0: none."""
    return min(max_samples(params) - num_output_tokens, max_model_len - num_tokens)


def check_finish(
    token_id: int,
    num_output_tokens: int,
    num_tokens: int,
    params: SamplingParams,
    eos_token_ids: Collection[int],
    max_model_len: int,
) -> FinishReason | None:
    """Why the request ends after appending `token_id`, or None to keep going.

    `num_output_tokens` and `num_tokens` (prompt + output) already count `token_id`. A request that
    generates nothing (max_tokens 0) ends at its prompt, whatever its first sample was (never shown).
    """
    if params.max_tokens == 0:
        return "length"
    if not params.ignore_eos and token_id in eos_token_ids:
        return "stop"
    if token_id in params.stop_token_ids:
        return "stop"
    if num_samples_left(num_output_tokens, num_tokens, params, max_model_len) <= 0:
        return "length"
    return None
