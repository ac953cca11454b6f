"""Verifying a step's drafts (the batcher proposes them; batcher/spec_decode/).

Only requests whose every token is the argmax of the raw logits draft (batcher/spec_decode/drafting.py),
so verification is greedy: a draft is accepted while it equals the target's argmax at its position;
the first mismatch is replaced by that argmax, and a run accepted whole gets the sampled bonus token.
Every token of the run is then exactly the one decoding without drafts would give.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def verify_greedy(
    draft_logits: torch.Tensor, drafts: Sequence[list[int]], bonus_token_ids: Sequence[int]
) -> list[list[int]]:
    """Per request, the tokens the step outputs (1..k+1): accepted drafts, then one the model chose.

    `draft_logits` [D, V]: per draft of every request in order, the logits at the token before it;
    `bonus_token_ids`: per request, the token sampled after its last draft."""
    targets = draft_logits.argmax(dim=-1).tolist() if drafts else []
    runs: list[list[int]] = []
    start = 0
    for proposed, bonus in zip(drafts, bonus_token_ids, strict=True):
        chosen = targets[start : start + len(proposed)]
        start += len(proposed)
        num_accepted = 0
        while num_accepted < len(proposed) and chosen[num_accepted] == proposed[num_accepted]:
            num_accepted += 1
        last = bonus if num_accepted == len(proposed) else chosen[num_accepted]
        runs.append([*proposed[:num_accepted], last])
    return runs
