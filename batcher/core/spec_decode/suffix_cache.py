"""Suffix decoding (Arctic Inference's method, simplified): drafts from the longest match of a
request's recent tokens in its own prompt + output or in recent requests' prompts + outputs.

Arctic keeps suffix trees and drafts the most frequent continuation; here each cached sequence is
found by the pair of tokens ending the match (an index of bigram -> latest places), the match is
extended backwards up to `max_depth` tokens, and the longest one wins (the latest on a tie). The
draft is what followed it, at most `spec_factor` x the match length: a long match predicts further.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence

PLACES_PER_BIGRAM = 4  # latest places kept per token pair: a common pair points at recent text


class SuffixCache:
    """Recent requests' tokens (prompt + output), bounded by `max_cached_requests`."""

    def __init__(self, max_cached_requests: int, max_depth: int, spec_factor: float) -> None:
        self.max_cached_requests = max_cached_requests
        self.max_depth = max_depth
        self.spec_factor = spec_factor
        self._seqs: OrderedDict[int, list[int]] = OrderedDict()  # oldest first
        self._index: dict[tuple[int, int], deque[tuple[int, int]]] = {}  # pair -> (seq, end of pair)
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._seqs)

    def add(self, token_ids: Sequence[int]) -> None:
        """Remember a finished request's tokens; the oldest is forgotten past the bound."""
        if self.max_cached_requests <= 0 or len(token_ids) < 3:
            return
        seq_id, self._next_id = self._next_id, self._next_id + 1
        tokens = list(token_ids)
        self._seqs[seq_id] = tokens
        for end in range(2, len(tokens)):  # a pair followed by at least one token
            key = (tokens[end - 2], tokens[end - 1])
            places = self._index.get(key)
            if places is None:
                places = self._index[key] = deque(maxlen=PLACES_PER_BIGRAM)
            places.append((seq_id, end))
        while len(self._seqs) > self.max_cached_requests:
            self._forget(*self._seqs.popitem(last=False))

    def propose(self, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens following the longest match of the end of `token_ids`, in itself (before
        its end) or in a cached sequence; [] when its last two tokens occurred nowhere."""
        if k <= 0 or len(token_ids) < 3:
            return []
        key = (token_ids[-2], token_ids[-1])
        candidates: list[tuple[Sequence[int], int]] = [
            (self._seqs[seq_id], end) for seq_id, end in self._index.get(key, ()) if seq_id in self._seqs
        ]
        candidates += [(token_ids, end) for end in _own_places(token_ids, key)]
        best_len, best = 0, None
        for seq, end in candidates:
            length = self._match_length(token_ids, seq, end)
            if length >= best_len:  # later candidates are more recent: the request's own, latest last
                best_len, best = length, (seq, end)
        if best is None:
            return []
        seq, end = best
        limit = min(k, max(1, math.ceil(self.spec_factor * best_len)))
        return list(seq[end : end + limit])

    def _match_length(self, query: Sequence[int], seq: Sequence[int], end: int) -> int:
        """How many tokens before `end` in `seq` equal the end of `query` (at least the pair)."""
        length = 2
        limit = min(self.max_depth, len(query), end)
        while length < limit and seq[end - length - 1] == query[-length - 1]:
            length += 1
        return length

    def _forget(self, seq_id: int, tokens: list[int]) -> None:
        for end in range(2, len(tokens)):
            key = (tokens[end - 2], tokens[end - 1])
            places = self._index.get(key)
            if places is None:
                continue
            kept = [p for p in places if p[0] != seq_id]
            if not kept:
                del self._index[key]
            elif len(kept) != len(places):
                self._index[key] = deque(kept, maxlen=PLACES_PER_BIGRAM)


def _own_places(token_ids: Sequence[int], key: tuple[int, int]) -> list[int]:
    """Where the pair `key` ended earlier in `token_ids` (followed by a token), oldest first."""
    return [end for end in range(2, len(token_ids)) if (token_ids[end - 2], token_ids[end - 1]) == key]
