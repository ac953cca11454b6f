"""A model that would end its turn inside unfinished JSON closes the JSON instead.

The grammar forbids the stop tokens until the JSON is complete. Masked, a model that puts its
probability on ending (a small model never taught JSON, as the demo one, does it after a sentence)
would have that probability spread over everything else the grammar allows, which is mostly more of
the same string or number: it writes on until `max_tokens`, by default the rest of the context.
Here that probability goes instead to the allowed tokens that close what is open, in proportion to
the model's own probabilities of them, so each step the model wants to stop moves the JSON toward
its end, and it stops with `finish_reason` "stop" once the grammar allows it:

- tokens that start with `"` and hold only `"`, `}`, `]` (they close a string, or write an empty one
  where a value starts);
- else tokens of `}` and `]` only (they close an array or object after a number or literal);
- else those with a `,` (the schema requires another item or property first).

A row whose model does not lean toward stopping is barely changed: its closers gain the probability
of the stop tokens, in proportion. Rows that asked for `ignore_eos` are not steered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_BITS = torch.arange(32, dtype=torch.int32)


def closer_tiers(decoded_vocab: Sequence[bytes], vocab_size: int) -> torch.Tensor:
    """[3, vocab_size] bool: the closing tokens of each tier, in the order they are tried."""
    tiers = torch.zeros(3, vocab_size, dtype=torch.bool)
    for token_id, token in enumerate(decoded_vocab[:vocab_size]):
        chars = set(token)
        if not token or not chars <= set(b'"}], ') or chars <= {ord(" ")}:
            continue
        if ord(",") in chars:
            tiers[2, token_id] = True
        elif ord(" ") not in chars:
            tiers[0 if token[0] == ord('"') else 1, token_id] = True
    return tiers


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's bitmask [N, ceil(V / 32)] int32 as bool [N, vocab_size] (bit j of word i: token 32i+j)."""
    shifts = _BITS.to(bitmask.device)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab_size]


@dataclass(slots=True, frozen=True)
class JsonClosing:
    """The rows of a step's logits to steer, their rows in the step's bitmask, and what to steer by."""

    rows: list[int]
    tiers: torch.Tensor  # [3, V] bool on the logits' device (closer_tiers)
    stop_ids: torch.Tensor  # the grammar's stop tokens, long, on the logits' device

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        """Moves, in place, each row's probability of the stop tokens its grammar forbids onto the
        allowed closers of its first tier that has any (log space: logit += log(1 + p_stop / p_closers))."""
        index = torch.tensor(self.rows, device=logits.device)
        vocab_size = self.tiers.shape[1]
        allowed = unpack_bitmask(bitmask.index_select(0, index), vocab_size)
        logp = torch.log_softmax(logits.index_select(0, index)[:, :vocab_size].float(), dim=-1)
        stop_logp = logp.index_select(1, self.stop_ids)
        forbidden = ~allowed.index_select(1, self.stop_ids)
        log_stop = torch.logsumexp(stop_logp.masked_fill(~forbidden, float("-inf")), dim=-1)
        closers = torch.zeros_like(allowed)
        found = torch.zeros(len(self.rows), dtype=torch.bool, device=logits.device)
        for tier in self.tiers:
            candidates = allowed & tier
            take = candidates.any(dim=-1) & ~found
            closers |= candidates & take.unsqueeze(-1)
            found |= take
        log_closers = torch.logsumexp(logp.masked_fill(~closers, float("-inf")), dim=-1)
        boost = torch.logaddexp(log_closers, log_stop) - log_closers
        steer = found & torch.isfinite(log_stop) & torch.isfinite(log_closers)
        boost = torch.where(steer, boost, torch.zeros_like(boost))
        steered = logits.index_select(0, index)
        steered[:, :vocab_size] += closers * boost.unsqueeze(-1).to(steered.dtype)
        logits.index_copy_(0, index, steered)
