"""Drafts from a small model with the target's tokenizer (SPECULATIVE_CONFIG method "draft_model").

After a step, each request the batcher asked drafts for gets the draft model's greedy continuation
of its tokens; the batcher sends them with its next step, where they are verified like any draft
(spec_decode.py). Greedy drafts are point masses, so that verification keeps the target's
distribution at any temperature. Each request keeps its own KV cache in the draft model, cut back
to the tokens it shares with the request after each step (rejected drafts drop out), so a step feeds
the draft model only the tokens it has not seen; a request that comes back after preemption or
from another worker starts a cache from its tokens.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, PreTrainedModel

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _DraftCache:
    kv: DynamicCache
    token_ids: list[int] = field(default_factory=list)  # the tokens whose KV `kv` holds


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModelProposer:
    def __init__(
        self, model_dir: str, target_vocab_size: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        config = AutoConfig.from_pretrained(model_dir)
        draft_vocab = int(config.get_text_config().vocab_size)
        if draft_vocab > target_vocab_size:
            raise ValueError(
                f"the draft model {model_dir} has {draft_vocab} tokens, more than the target's "
                f"{target_vocab_size}: it needs the target's tokenizer"
            )
        self.model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            model_dir, config=config, dtype=dtype, attn_implementation="sdpa"
        )
        self.model.to(device)  # type: ignore[arg-type]
        self.model.eval()
        self.device = device
        # transformers renamed forward's `past_key_values` to `cache` within 5.x.
        forward_args = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        self.max_len = int(getattr(config.get_text_config(), "max_position_embeddings", 0) or 0)
        self._caches: dict[str, _DraftCache] = {}
        logger.info("draft model %s loaded (%d tokens)", model_dir, draft_vocab)

    @torch.inference_mode()
    def propose(self, req_id: str, token_ids: list[int], k: int) -> list[int]:
        """The draft model's `k` greedy tokens after `token_ids` (fewer where its context ends)."""
        if self.max_len:
            k = min(k, self.max_len - len(token_ids))
        if k <= 0 or not token_ids:
            return []
        cache = self._caches.get(req_id)
        if cache is None:
            cache = self._caches[req_id] = _DraftCache(DynamicCache(config=self.model.config))
        # At least the last token is fed: its logits give the first draft.
        keep = min(_common_prefix(cache.token_ids, token_ids), len(token_ids) - 1)
        if keep < len(cache.token_ids):
            # A negative count removes that many tokens in every transformers 5.x (a positive one
            # meant the length to keep before 5.2x and is refused since).
            cache.kv.crop(keep - len(cache.token_ids))
            del cache.token_ids[keep:]
        feed = token_ids[keep:]
        drafts: list[int] = []
        for _ in range(k):
            inputs = torch.tensor([feed], device=self.device)
            logits = self.model(input_ids=inputs, use_cache=True, **{self._cache_arg: cache.kv}).logits
            cache.token_ids += feed
            token = int(logits[0, -1].max(dim=-1).indices)
            drafts.append(token)
            feed = [token]
        return drafts

    def free(self, req_id: str) -> None:
        self._caches.pop(req_id, None)

    def clear(self) -> None:
        self._caches.clear()
