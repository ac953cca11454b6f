"""Speculative decoding's figures from vLLM's counters (drafts, draft tokens, accepted tokens, accepted
per position), for the dashboard (from the batcher's stats hash) and `benchmarks.serve` (from a
server's /metrics, ours or vLLM's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from common.metrics_schema import ACCEPTED_PER_POS


@dataclass(frozen=True, slots=True)
class SpecDecodeCounts:
    num_drafts: float = 0.0  # decodes that drafted
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()  # entry i: drafts accepted at position i of their step

    def __sub__(self, earlier: SpecDecodeCounts) -> SpecDecodeCounts:
        """What was counted since `earlier` (a server's counters before a run)."""
        pos = [
            n - (earlier.accepted_per_pos[i] if i < len(earlier.accepted_per_pos) else 0.0)
            for i, n in enumerate(self.accepted_per_pos)
        ]
        return SpecDecodeCounts(
            self.num_drafts - earlier.num_drafts,
            self.num_draft_tokens - earlier.num_draft_tokens,
            self.num_accepted_tokens - earlier.num_accepted_tokens,
            tuple(pos),
        )

    @property
    def mean_accepted_len(self) -> float | None:
        """vLLM's "mean acceptance length": tokens a drafting decode outputs, the model's own included."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens / draft tokens."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def acceptance_per_pos(self) -> list[float]:
        """vLLM's per-position acceptance rate: of all drafting decodes, the share accepted at position i."""
        return [n / self.num_drafts for n in self.accepted_per_pos] if self.num_drafts else []


def counts_from_stats(stats: Mapping[str, float]) -> SpecDecodeCounts:
    """The batcher's stats hash (`spec_decode_num_drafts`, ..., `<ACCEPTED_PER_POS>:<i>`)."""
    prefix = f"{ACCEPTED_PER_POS}:"
    per_pos = {int(k[len(prefix) :]): v for k, v in stats.items() if k.startswith(prefix)}
    return SpecDecodeCounts(
        float(stats.get("spec_decode_num_drafts", 0.0)),
        float(stats.get("spec_decode_num_draft_tokens", 0.0)),
        float(stats.get("spec_decode_num_accepted_tokens", 0.0)),
        tuple(float(per_pos.get(i, 0.0)) for i in range(max(per_pos) + 1 if per_pos else 0)),
    )
