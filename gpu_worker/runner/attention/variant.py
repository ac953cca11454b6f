"""What makes one layer's attention differ from plain causal softmax attention.

transformers hands these to the attention function per layer and per call (`sliding_window`,
`softcap`, `s_aux` / `sinks`), read from the model's config: Mistral's one window for every layer,
Gemma 2/3's and gpt-oss's alternating local and global layers, Gemma 2's logit softcapping, gpt-oss's
per-head sink logits. Every backend takes one with each call and must give eager attention's result:
`eager_attention_lse` below computes it as transformers' eager functions do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class AttentionVariant:
    # A query sees the last `window` positions, itself included (transformers' sliding_window:
    # kv > q - window); None: every earlier position.
    window: int | None = None
    # Scores become softcap * tanh(scores / softcap) after scaling, before the mask (Gemma 2).
    softcap: float | None = None
    # [heads] learned logits, one extra softmax term per head that takes probability mass and adds
    # no value (gpt-oss's attention sinks).
    sinks: torch.Tensor | None = None

    @property
    def is_plain(self) -> bool:
        return self.window is None and self.softcap is None and self.sinks is None

    @property
    def needs_scores(self) -> bool:
        """Softcapping and sinks change the softmax itself: SDPA cannot compute them."""
        return self.softcap is not None or self.sinks is not None

    def within(self, max_seq_len: int) -> AttentionVariant:
        """This variant for a step whose longest sequence is `max_seq_len`: a window that long or
        longer never hides a position, so it is dropped (a plain mask, or none, serves)."""
        if self.window is None or max_seq_len > self.window:
            return self
        return AttentionVariant(None, self.softcap, self.sinks)


PLAIN = AttentionVariant()


def allowed_positions(
    query_pos: torch.Tensor, num_keys: int, window: int | None, key_limits: torch.Tensor | None = None
) -> torch.Tensor:
    """[..., num_keys] bool: which key positions 0 .. num_keys - 1 each query at `query_pos` [...]
    sees (causal, or up to its `key_limits` [...] where given, and within the window)."""
    keys = torch.arange(num_keys, device=query_pos.device)
    pos = query_pos.unsqueeze(-1)
    allowed = keys <= (pos if key_limits is None else key_limits.unsqueeze(-1))
    if window is not None:
        allowed &= keys > pos - window
    return allowed


def eager_attention_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    variant: AttentionVariant,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, M, D] over k/v [B, KVH, L, D] (GQA: H a multiple of KVH), `mask` bool broadcastable
    to [B, H, M, L] (True = may attend) -> ([B, H, M, D] in q's dtype, the log-sum-exp [B, H, M] of
    the scores, sinks included), computed in float32. A row that sees no position and has no sink
    gets zeros and -inf."""
    rep = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(rep, dim=1)
    v = v.float().repeat_interleave(rep, dim=1)
    scores = torch.matmul(q.float(), k.transpose(-1, -2)) * scale
    if variant.softcap is not None:
        scores = torch.tanh(scores / variant.softcap) * variant.softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if variant.sinks is not None:
        sinks = variant.sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sinks], dim=-1)
    lse = torch.logsumexp(scores, dim=-1)
    # Clamped: a row that sees nothing has lse -inf, and exp(-inf - -inf) would be NaN.
    probs = torch.exp(scores - lse.unsqueeze(-1).clamp(min=torch.finfo(torch.float32).min))
    if variant.sinks is not None:
        probs = probs[..., :-1]
    return torch.matmul(probs, v).to(q.dtype), lse


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    variant: AttentionVariant,
    is_causal: bool = False,
) -> torch.Tensor:
    """SDPA where it can compute the variant (a window is only a mask), eager attention where it cannot."""
    if not variant.needs_scores:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
        )
    if is_causal:
        mask = allowed_positions(torch.arange(q.shape[2], device=q.device), k.shape[2], None)
    return eager_attention_lse(q, k, v, mask, scale, variant)[0]
