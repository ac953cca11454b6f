"""What a run leaves behind: the printed tables and the JSON result file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.figures.metrics import LATENCY_METRICS, Summary, percentile_label, request_tpot
from benchmarks.load.runner import RunResult
from benchmarks.load.spec_decode import format_per_pos
from benchmarks.load.spec_decode import record as spec_record

_COUNT_ROWS = [
    ("completed", "Successful requests", ""),
    ("failed", "Failed requests", "lower"),
    ("duration_s", "Benchmark duration (s)", ""),
    ("total_input_tokens", "Total input tokens", ""),
    ("cached_input_tokens", "Input tokens from prefix cache", ""),
    ("total_output_tokens", "Total generated tokens", ""),
    ("request_throughput", "Request throughput (req/s)", "higher"),
    ("request_goodput", "Request goodput (req/s)", "higher"),
    ("output_throughput", "Output token throughput (tok/s)", "higher"),
    ("total_token_throughput", "Total token throughput (tok/s)", "higher"),
    ("max_concurrent_requests", "Peak concurrent requests", ""),
]
_LATENCY_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
# Only runs whose server drafted have these (benchmarks/load/spec_decode.py); "-" for the others.
_SPEC_ROWS = [
    ("spec_accepted_len", "Mean accepted length (spec decode)", "higher"),
    ("spec_acceptance_rate", "Draft acceptance rate", "higher"),
]


def metric_rows(percentiles: Sequence[float]) -> list[tuple[str, str, str]]:
    """(summary key, label, which way is better) for every figure the tables show."""
    rows = list(_COUNT_ROWS)
    for name in LATENCY_METRICS:
        label = _LATENCY_NAMES[name]
        rows.append((f"mean_{name}_ms", f"Mean {label} (ms)", "lower"))
        rows.append((f"median_{name}_ms", f"Median {label} (ms)", "lower"))
        for p in (p for p in percentiles if p != 50):  # p50 is the median row
            rows.append(
                (f"{percentile_label(p)}_{name}_ms", f"P{percentile_label(p)[1:]} {label} (ms)", "lower")
            )
    return rows + _SPEC_ROWS


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def format_summary(
    name: str, summary: Summary, percentiles: Sequence[float], result: RunResult | None = None
) -> str:
    lines = [f"{f' Serving Benchmark Result: {name} ':=^60}"]
    for key, label, _ in metric_rows(percentiles):
        if key in summary:
            lines.append(f"{label + ':':<44}{_fmt(summary[key]):>16}")
    if result is not None and result.spec_decode is not None:
        lines.append(format_per_pos(result.spec_decode))
    lines.append("=" * 60)
    return "\n".join(lines)


def ratios(summaries: dict[str, Summary], baseline: str) -> dict[str, dict[str, float | None]]:
    """Each system's figures divided by the baseline's (None where the baseline's is 0)."""
    base = summaries[baseline]
    return {
        name: {key: (value / base[key] if base.get(key) else None) for key, value in summary.items()}
        for name, summary in summaries.items()
        if name != baseline
    }


def format_comparison(summaries: dict[str, Summary], baseline: str, percentiles: Sequence[float]) -> str:
    names = list(summaries)
    by_ratio = ratios(summaries, baseline)
    header = ["metric", *names, *(f"{n}/{baseline}" for n in by_ratio), "better"]
    table: list[list[str]] = [header]
    for key, label, better in metric_rows(percentiles):
        if not any(key in s for s in summaries.values()):
            continue
        values = [_fmt(summaries[n].get(key)) for n in names]
        shown = [by_ratio[n].get(key) for n in by_ratio]
        table.append([label, *values, *(f"{r:.2f}x" if r is not None else "-" for r in shown), better])
    return render_table(table)


def render_table(table: list[list[str]]) -> str:
    """Rows of cells as aligned text: the first column left, the rest right, a rule under the header."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = []
    for i, row in enumerate(table):
        cells = [row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))]
        lines.append("  ".join(cells))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def request_records(result: RunResult) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "send_time_s": o.start_time - result.start_time,
            "input_len": o.prompt_len,
            "output_len": o.output_len,
            "output_tokens": o.output_tokens,
            "ttft_s": o.ttft,
            "tpot_s": request_tpot(o) if o.success else 0.0,
            "itl_s": o.itl,
            "e2el_s": o.latency,
            "success": o.success,
            "error": o.error,
        }
        for i, o in enumerate(result.outputs)
    ]


def run_record(result: RunResult, summary: Summary) -> dict[str, Any]:
    target = result.target
    spec = {} if result.spec_decode is None else {"spec_decode": spec_record(result.spec_decode)}
    return {
        "system": {
            "name": target.name,
            "base_url": target.base_url,
            "backend": target.backend,
            "prompt_format": target.prompt_format,
            "model": result.model,
        },
        "summary": summary,
        **spec,
        "requests": request_records(result),
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
