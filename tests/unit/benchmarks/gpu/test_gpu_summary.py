"""benchmarks/gpu/gpu_summary.py: what finished is reported, what did not is named under "missing", and
every step's limit, seconds and exit status (or skip) come with the run's wall time and budget."""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks.gpu.gpu_summary import main, summarize


def test_a_partial_run_reports_its_steps_and_what_is_missing(tmp_path: Path) -> None:
    decode = {"copy_bandwidth_gb_s": 3000.0, "decode": [{"batch": 1, "forward_ms": 20.0}]}
    (tmp_path / "decode.json").write_text(json.dumps(decode))
    (tmp_path / "parity_bfloat16.json").write_text(json.dumps({"identical_share": 0.9}))
    (tmp_path / "steps.tsv").write_text(
        "parity_bfloat16\t75\t41\t0\ndecode\t120\t120\t124\nkernels\t0\t0\tskipped\n"
    )
    summary = summarize(tmp_path, budget_s=420, started=time.time() - 400)
    assert summary["decode"] == decode["decode"] and summary["copy_bandwidth_gb_s"] == 3000.0
    assert summary["steps"] == {
        "parity_bfloat16": {"limit_s": 75, "wall_s": 41, "rc": 0},
        "decode": {"limit_s": 120, "wall_s": 120, "rc": 124},
        "kernels": {"skipped": True},
    }
    assert {"e2e", "e2e_64", "control", "kernels", "parity.float32"} <= set(summary["missing"])
    assert "decode" not in summary["missing"] and "parity.bfloat16" not in summary["missing"]
    assert summary["budget_s"] == 420 and 399 <= summary["wall_s"] <= 460
    assert summary["stopped"] is None


def test_a_stopped_run_says_why(tmp_path: Path) -> None:
    (tmp_path / "stopped.txt").write_text("carry_verify: cannot import fastapi (ModuleNotFoundError: x)\n")
    out = tmp_path / "gpu-check.json"
    main([str(tmp_path), "--out", str(out)])
    summary = json.loads(out.read_text())
    assert summary["stopped"] == "carry_verify: cannot import fastapi (ModuleNotFoundError: x)"
    assert summary["steps"] == {} and summary["wall_s"] is None
