"""benchmarks/worker_step/draft_propose.py: the draft model's proposals timed per request count."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.worker_step.draft_propose import main


def test_each_request_count_is_timed(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(tiny_model_dir)
    args = ["--model", model, "--draft-model", model, "--num-requests", "1,3", "--num-drafts", "2"]
    main(
        [
            *args,
            "--prompt-len",
            "8",
            "--rounds",
            "2",
            "--num-threads",
            "1",
            "--num-blocks",
            "64",
            "--no-compile",
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    counts = [
        int(m.group(1)) for line in lines if (m := re.match(r"\s*(\d+) requests x 2 drafts: [\d.]+ ms", line))
    ]
    assert counts == [1, 3]
