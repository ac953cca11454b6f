"""Repeated comparisons: every system once per round, then medians and the spread of paired ratios.

One run per system says little on a shared machine, whose speed drifts between runs. `compare
--repeat N` runs N rounds; each round runs every system on the same request list, in reverse order
every other round so that neither system always goes first. A ratio is taken within its round
(system / baseline, both measured minutes apart) and reported as the median of the rounds with its
lowest and highest value: the spread is what an error bar would show.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from benchmarks.figures.metrics import Summary
from benchmarks.figures.report import metric_rows, ratios, render_table

Spread = dict[str, float]  # median, min, max


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """Systems in spec order on even rounds, reversed on odd ones."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def _spread(values: Sequence[float]) -> Spread:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summary_spread(rounds: Sequence[Summary]) -> dict[str, Spread]:
    """Each figure's median and range over the rounds in which it was measured."""
    keys = [k for k in rounds[0] if all(k in r for r in rounds)]
    return {k: _spread([r[k] for r in rounds]) for k in keys}


def ratio_spread(rounds: Sequence[dict[str, Summary]], baseline: str) -> dict[str, dict[str, Spread]]:
    """Per system (not the baseline), each figure's ratio to the baseline's in the same round."""
    per_round = [ratios(r, baseline) for r in rounds if baseline in r]
    out: dict[str, dict[str, Spread]] = {}
    for name in per_round[0] if per_round else []:
        out[name] = {}
        for key in per_round[0][name]:
            values = [r[name].get(key) for r in per_round]
            if all(v is not None for v in values):  # None: the baseline measured 0 in some round
                out[name][key] = _spread([v for v in values if v is not None])
    return out


def _fmt(s: Spread, suffix: str = "") -> str:
    def num(v: float) -> str:
        whole = not suffix and float(v).is_integer()  # counts; a ratio keeps its decimals
        return f"{v:.0f}" if whole or abs(v) >= 1000 else f"{v:.2f}"

    return f"{num(s['median'])}{suffix} [{num(s['min'])}-{num(s['max'])}]"


def format_repeated(
    spreads: dict[str, dict[str, Spread]],
    rel: dict[str, dict[str, Spread]],
    baseline: str,
    percentiles: Sequence[float],
    num_rounds: int,
) -> str:
    """Medians with [min-max] over the rounds, then each system's paired ratio to the baseline."""
    names = list(spreads)
    header = ["metric", *names, *(f"{n}/{baseline}" for n in rel), "better"]
    table: list[list[str]] = [header]
    for key, label, better in metric_rows(percentiles):
        if not any(key in spreads[n] for n in names):
            continue
        values = [_fmt(spreads[n][key]) if key in spreads[n] else "-" for n in names]
        shown = [_fmt(rel[n][key], "x") if key in rel[n] else "-" for n in rel]
        table.append([label, *values, *shown, better])
    title = f"median [min-max] over {num_rounds} rounds; ratios paired within each round"
    return f"{title}\n{render_table(table)}"
