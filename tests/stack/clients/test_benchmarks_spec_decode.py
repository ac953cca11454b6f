"""`benchmarks.serve` against a live stack that drafts: the run's drafts (warm-up excluded) come from
the gateway's /metrics into the printed report and the JSON result, agreeing with the batcher's
counters."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.serve import main as serve_main
from harness.processes.services import Stack

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
NUM_REQUESTS = 3


def test_a_run_reports_the_servers_accepted_length(
    make_stack: Callable[[], Stack], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = make_stack().start_all(1, batcher_env={"SPECULATIVE_CONFIG": NGRAM})
    result_file = tmp_path / "result.json"
    argv = ["--base-url", stack.base_url, "--model", str(stack.model_dir), "--dataset", "repetitive"]
    argv += ["--num-prompts", str(NUM_REQUESTS), "--random-input-len", "48", "--random-output-len", "40"]
    argv += ["--request-rate", "inf", "--disable-tqdm", "--result-file", str(result_file)]
    assert serve_main(argv) == 0
    result = json.loads(result_file.read_text())
    spec, summary = result["spec_decode"], result["summary"]
    stats = stack.stats_after(NUM_REQUESTS + 1)  # the warm-up request too
    # Greedy output of the random-weight test model loops, which n-gram drafts predict.
    assert 0 < spec["num_accepted_tokens"] <= stats["spec_decode_num_accepted_tokens"]
    assert spec["num_drafts"] <= stats["spec_decode_num_drafts"]
    assert summary["spec_accepted_len"] == pytest.approx(1 + spec["num_accepted_tokens"] / spec["num_drafts"])
    assert sum(spec["accepted_per_pos"]) == spec["num_accepted_tokens"]
    printed = capsys.readouterr().out
    assert "Mean accepted length (spec decode):" in printed and "Acceptance per draft position:" in printed
