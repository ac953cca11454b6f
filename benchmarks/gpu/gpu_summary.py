"""Collects the step results of benchmarks/gpu/gpu_check.sh into one JSON summary (printed and written).

    python -m benchmarks.gpu.gpu_summary WORK_DIR --out docs/results/gpu-check.json --budget-s 420 --started T

A step that did not finish leaves its key out and is named under "missing", so a partial run still
reports what it measured; "steps" gives each step's limit, seconds and exit status (or "skipped"),
"wall_s" the run's time so far against "budget_s", and "stopped" why the run ended before its steps
(the carry: a module that does not import), when it did.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _kernels(work: Path) -> dict[str, int] | None:
    try:
        suite = ET.parse(work / "kernels.xml").getroot()
    except (OSError, ET.ParseError):
        return None
    node = suite if suite.tag == "testsuite" else suite.find("testsuite")
    if node is None:
        return None
    counts = {k: int(node.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def _e2e(result: Any, concurrency: int) -> dict[str, Any] | None:
    if not result or "cbserve" not in result.get("systems", {}):
        return None
    summary = result["systems"]["cbserve"]["summary"]
    return {
        "concurrency": concurrency,
        "output_tok_s": summary["output_throughput"],
        "tpot_p50_ms": summary["median_tpot_ms"],
        "ttft_mean_ms": summary["mean_ttft_ms"],
        "completed": summary.get("completed"),
    }


def _control(rows: Any) -> dict[str, Any] | None:
    if not rows:
        return None
    row = rows[-1]
    step_ms, idle_ms = row["worker_step_ms"], row["worker_idle_ms_per_step"]
    return {
        "batch": row["batch_size"],
        "async_scheduling": row["async_scheduling"],
        "worker_step_ms": step_ms,
        "worker_idle_ms": idle_ms,
        "idle_fraction": idle_ms / step_ms if step_ms else None,
    }


def _steps(work: Path) -> dict[str, dict[str, Any]]:
    """steps.tsv (benchmarks/gpu/steps.sh): NAME, limit, seconds, exit status or "skipped", per line."""
    steps: dict[str, dict[str, Any]] = {}
    try:
        lines = (work / "steps.tsv").read_text().splitlines()
    except OSError:
        return steps
    for line in lines:
        name, limit, seconds, rc = line.split("\t")
        if rc == "skipped":
            steps[name] = {"skipped": True}
        else:
            steps[name] = {"limit_s": int(limit), "wall_s": int(seconds), "rc": int(rc)}
    return steps


def _text(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def summarize(work: Path, budget_s: int | None = None, started: float | None = None) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    decode = _load(work / "decode.json")
    summary: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit.stdout.strip() or None,
        "env": (work / "env.txt").read_text() if (work / "env.txt").exists() else None,
        # What Triton's launcher needs (C compiler, Python.h), and the attention backend the run used.
        "toolchain": _load(work / "toolchain.json"),
        "kernels": _kernels(work),
        "parity": {dtype: _load(work / f"parity_{dtype}.json") for dtype in ("float32", "bfloat16")},
        "copy_bandwidth_gb_s": decode and decode["copy_bandwidth_gb_s"],
        "decode": decode and decode["decode"],
        "e2e": _e2e(_load(work / "e2e_16.json"), 16),
        "e2e_64": _e2e(_load(work / "e2e_64.json"), 64),
        "control": _control(_load(work / "control.json")),
    }
    summary["missing"] = [key for key, value in summary.items() if value is None] + [
        f"parity.{dtype}" for dtype, value in summary["parity"].items() if value is None
    ]
    summary["steps"] = _steps(work)
    summary["budget_s"] = budget_s
    summary["wall_s"] = None if started is None else round(time.time() - started)
    summary["stopped"] = _text(work / "stopped.txt")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.gpu_summary", description=__doc__)
    parser.add_argument("work", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=int, help="the run's budget, reported beside its wall time")
    parser.add_argument("--started", type=float, help="the run's start (epoch seconds)")
    args = parser.parse_args(argv)
    summary = summarize(args.work, args.budget_s, args.started)
    text = json.dumps(summary, indent=2)
    print(text)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
