"""Speculative decoding in `benchmarks.serve`'s reports and the dashboard: the counters read from a
server's /metrics (ours and vLLM's), what the run drafted, and the rows of the tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from benchmarks.figures.metrics import summarize
from benchmarks.figures.repeats import format_repeated, ratio_spread, summary_spread
from benchmarks.figures.report import format_comparison, format_summary, run_record
from benchmarks.load.client import RequestOutput
from benchmarks.load.runner import RunResult, Target
from benchmarks.load.spec_decode import counted_during, parse_spec_counters, summary_fields
from benchmarks.serve import parse_args, resolve_systems
from common.spec_decode.spec_decode_stats import SpecDecodeCounts, counts_from_stats
from common.spec_decode.speculative_config import SpeculativeConfig
from gateway.observability.batcher_collector import BatcherCollector
from gateway.observability.dashboard_events import dashboard_stats

SPECS = Path(__file__).resolve().parents[3] / "benchmarks" / "specs"
STATS = {
    "spec_decode_num_drafts": 10.0,
    "spec_decode_num_draft_tokens": 40.0,
    "spec_decode_num_accepted_tokens": 15.0,
    "spec_decode_num_accepted_tokens_per_pos:0": 8.0,
    "spec_decode_num_accepted_tokens_per_pos:1": 5.0,
    "spec_decode_num_accepted_tokens_per_pos:2": 2.0,
    "spec_decode_num_accepted_tokens_per_pos:3": 0.0,
    "num_running": 1.0,
}
VLLM = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 6.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 4.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="2"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 1.0
"""


def our_metrics(stats: dict[str, float]) -> str:
    registry = CollectorRegistry()
    registry.register(BatcherCollector(stats, None, now=0.0))
    return generate_latest(registry).decode()


def test_our_and_vllms_metrics_give_the_same_counts() -> None:
    ours = parse_spec_counters(our_metrics(STATS))
    assert ours == counts_from_stats(STATS)
    assert ours == SpecDecodeCounts(10, 40, 15, (8, 5, 2, 0))
    theirs = parse_spec_counters(VLLM)  # summed over engines, positions in order
    assert theirs == SpecDecodeCounts(10, 40, 15, (8, 5, 2))
    assert parse_spec_counters(our_metrics({"num_running": 1.0})) is None  # speculation off


def test_the_figures_are_vllms() -> None:
    counts = SpecDecodeCounts(10, 40, 15, (8, 5, 2, 0))
    assert counts.mean_accepted_len == 2.5  # 1 + 15 / 10
    assert counts.acceptance_rate == 15 / 40
    assert counts.acceptance_per_pos == [0.8, 0.5, 0.2, 0.0]
    assert SpecDecodeCounts().mean_accepted_len is None


def test_a_run_counts_what_was_drafted_after_the_warm_ups() -> None:
    before = SpecDecodeCounts(2, 8, 3, (2, 1))
    after = SpecDecodeCounts(10, 40, 15, (8, 5, 2))
    assert counted_during(before, after) == SpecDecodeCounts(8, 32, 12, (6, 4, 2))
    assert counted_during(after, after) is None  # nothing drafted in the run
    assert counted_during(None, None) is None


def _summary(spec: SpecDecodeCounts | None) -> tuple[RunResult, dict[str, float]]:
    outputs = [RequestOutput(success=True, prompt_len=4, output_len=3, output_tokens=3, latency=0.3)]
    result = RunResult(Target("x", "http://h"), "m", outputs, 1.0, 0.0, spec)
    summary = summarize(outputs, 1.0, [50])
    if spec is not None:
        summary.update(summary_fields(spec))
    return result, summary


def test_the_tables_show_accepted_length_and_rate_where_drafts_were_made() -> None:
    spec = SpecDecodeCounts(8, 32, 12, (6, 4, 2))
    on_result, on = _summary(spec)
    _, off = _summary(None)
    printed = format_summary("ngram", on, [50], on_result)
    assert "Mean accepted length (spec decode):" in printed and "2.50" in printed
    assert "Acceptance per draft position:" in printed and "0.75 0.50 0.25" in printed
    table = format_comparison({"off": off, "ngram": on}, "off", [50]).splitlines()
    row = next(line for line in table if line.startswith("Mean accepted length"))
    assert row.split()[-4:] == ["-", "2.50", "-", "higher"]  # off, ngram, ngram/off, better
    rate = next(line for line in table if line.startswith("Draft acceptance rate"))
    assert "0.38" in rate
    rounds = [{"off": off, "ngram": on}] * 2
    spreads = {n: summary_spread([r[n] for r in rounds]) for n in ("off", "ngram")}
    repeated = format_repeated(spreads, ratio_spread(rounds, "off"), "off", [50], 2)
    assert any(
        line.startswith("Mean accepted length") and "2.50 [2.50-2.50]" in line
        for line in repeated.splitlines()
    )
    assert run_record(on_result, on)["spec_decode"]["mean_accepted_len"] == 2.5
    assert "spec_decode" not in run_record(_summary(None)[0], off)


def test_the_dashboard_shows_the_batchers_acceptance() -> None:
    shown = dashboard_stats({**STATS, "spec_decode_num_workers_off": 1.0}, None, now=0.0)
    assert (shown.spec_accepted_len, shown.spec_acceptance_rate) == (2.5, 15 / 40)
    assert shown.spec_acceptance_per_pos == [0.8, 0.5, 0.2, 0.0]
    assert shown.spec_num_workers_off == 1
    assert dashboard_stats({"num_running": 0.0}, None, now=0.0).spec_accepted_len is None


@pytest.mark.parametrize(
    ("spec", "systems"),
    [
        (
            "cpu-speculative.toml",
            ["spec-off", "ngram-4", "ngram-4-any-batch", "ngram-8", "suffix-4", "draft-model-4"],
        ),
        (
            "cpu-speculative-16.toml",
            ["spec-off", "ngram-4", "ngram-4-always", "spec-off-async", "ngram-4-async"],
        ),
    ],
)
def test_the_speculative_specs_parse_with_the_settings_the_services_take(
    spec: str, systems: list[str]
) -> None:
    args, compare = parse_args(["compare", "--spec", str(SPECS / spec)])
    resolved, baseline = resolve_systems(args)
    assert compare and baseline == "spec-off" and [s.name for s in resolved] == systems
    for system in resolved:
        assert system.launch is not None
        raw = system.launch.env.get("SPECULATIVE_CONFIG")
        if raw is not None:
            SpeculativeConfig.model_validate_json(raw)
    if spec == "cpu-speculative-16.toml":  # the non-repetitive case: sampled, 16 in flight, auto-off on
        assert (args.temperature, args.max_concurrency) == (1.0, 16)
        configs = {
            s.name: s.launch.env["SPECULATIVE_CONFIG"]
            for s in resolved
            if s.launch and "SPECULATIVE_CONFIG" in s.launch.env
        }
        ngram = SpeculativeConfig.model_validate_json(configs["ngram-4"])
        assert ngram.disable_by_acceptance_rate == 0.15
        # Acceptance alone decides there: the batch-size bound (8 by default) would stop all drafts.
        assert all(
            SpeculativeConfig.model_validate_json(c).disable_by_batch_size is None for c in configs.values()
        )
        assert (
            SpeculativeConfig.model_validate_json(configs["ngram-4-always"]).disable_by_acceptance_rate
            is None
        )
