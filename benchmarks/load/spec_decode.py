"""A server's speculative-decoding counters around a run, read from its /metrics: ours
(`cbserve:spec_decode_*`) or vLLM's (`vllm:spec_decode_*`), the same names after the prefix. A server
without them (no /metrics, or speculation off) reports nothing."""

from __future__ import annotations

import re

import aiohttp

from common.spec_decode.spec_decode_stats import SpecDecodeCounts

# `<prefix>:spec_decode_<name>_total{labels} <value>`; per position, the label `position`.
_SAMPLE = re.compile(r"^(?:cbserve|vllm):spec_decode_(\w+?)_total(?:\{([^}]*)\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d+)"')
METRICS_TIMEOUT_S = 10.0


def parse_spec_counters(text: str) -> SpecDecodeCounts | None:
    """The counters in a Prometheus text exposition, summed over other labels (vLLM labels each
    engine); None when it has none."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        position = _POSITION.search(labels)
        if name == "num_accepted_tokens_per_pos" and position is not None:
            pos = int(position.group(1))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
        else:
            totals[name] = totals.get(name, 0.0) + value
    if "num_drafts" not in totals:
        return None
    return SpecDecodeCounts(
        totals["num_drafts"],
        totals.get("num_draft_tokens", 0.0),
        totals.get("num_accepted_tokens", 0.0),
        tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1 if per_pos else 0)),
    )


async def read_spec_counters(session: aiohttp.ClientSession, base_url: str) -> SpecDecodeCounts | None:
    """`base_url`'s counters now; None when it does not serve them (a failed read is not the run's)."""
    try:
        timeout = aiohttp.ClientTimeout(total=METRICS_TIMEOUT_S)
        async with session.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout) as response:
            if response.status != 200:
                return None
            return parse_spec_counters(await response.text())
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None


def counted_during(
    before: SpecDecodeCounts | None, after: SpecDecodeCounts | None
) -> SpecDecodeCounts | None:
    """What the run drafted; None when the server drafted nothing in it."""
    if after is None:
        return None
    during = after - before if before is not None else after
    return during if during.num_drafts > 0 else None


def summary_fields(counts: SpecDecodeCounts) -> dict[str, float]:
    """The figures that go into a run's summary (and so its tables and ratios)."""
    figures = {"spec_accepted_len": counts.mean_accepted_len, "spec_acceptance_rate": counts.acceptance_rate}
    return {key: value for key, value in figures.items() if value is not None}


def format_per_pos(counts: SpecDecodeCounts) -> str:
    rates = " ".join(f"{r:.2f}" for r in counts.acceptance_per_pos)
    return f"{'Acceptance per draft position:':<44}{rates:>16}"


def record(counts: SpecDecodeCounts) -> dict[str, object]:
    """The run's counters and figures for the JSON result."""
    return {
        "num_drafts": counts.num_drafts,
        "num_draft_tokens": counts.num_draft_tokens,
        "num_accepted_tokens": counts.num_accepted_tokens,
        "accepted_per_pos": list(counts.accepted_per_pos),
        "mean_accepted_len": counts.mean_accepted_len,
        "acceptance_rate": counts.acceptance_rate,
        "acceptance_per_pos": counts.acceptance_per_pos,
    }
