"""N-gram prompt lookup (vLLM's `ngram` method): draft the tokens that followed the last time the
request's current suffix appeared in its own prompt + output. No model, no state between steps."""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(token_ids: Sequence[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to `k` tokens that followed the most recent earlier occurrence of the longest suffix of
    `token_ids` of `min_n`..`max_n` tokens; [] when no such suffix occurred before."""
    num_tokens = len(token_ids)
    if k <= 0:
        return []
    for n in range(min(max_n, num_tokens - 1), min_n - 1, -1):
        suffix = list(token_ids[num_tokens - n :])
        # Latest start first: recent context predicts the continuation best.
        for start in range(num_tokens - n - 1, -1, -1):
            if token_ids[start] == suffix[0] and list(token_ids[start : start + n]) == suffix:
                follow = start + n
                return list(token_ids[follow : min(follow + k, num_tokens)])
    return []
