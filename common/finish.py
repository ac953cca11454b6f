"""Finish decisions from token ids, shared so that every worker decides the same way."""

from __future__ import annotations

from collections.abc import Collection

from common.protocol import FinishReason, SamplingParams


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
    if num_output_tokens >= params.max_tokens or num_tokens >= max_model_len:
        return "length"
    return None
