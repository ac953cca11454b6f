"""The embedding throughput comparison runs both sides on one tiny model and says how far they agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.baselines.embed_throughput import main
from harness.models.pooling_models import build_bert_embedder


def test_both_sides_are_timed_and_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build_bert_embedder(tmp_path / "bert")
    out = tmp_path / "result.json"
    args = ["--model", str(model), "--num-inputs", "8", "--repeat", "1", "--json", str(out)]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["num_inputs"] == 8 and result["num_tokens"] > 8
    assert result["cbserve_tokens_per_s"] > 0 and result["sentence_transformers_tokens_per_s"] > 0
    assert result["min_cosine"] >= 0.99999
    assert "sentence-transformers encode" in capsys.readouterr().out
