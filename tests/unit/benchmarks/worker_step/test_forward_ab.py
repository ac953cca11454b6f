"""benchmarks/worker_step/forward_ab.py: forward variants side by side, and their agreement."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.worker_step.forward_ab import main, parse_variant


def test_variant_names_say_compile_and_weights() -> None:
    assert parse_variant("eager") == (False, None)
    assert parse_variant("int8-compiled") == (True, "int8")
    assert parse_variant("pywrap-compiled") == (True, None)
    for name in ("int4-eager", "pywrap-eager"):  # the Python wrapper is a compiled variant only
        with pytest.raises(SystemExit, match="unknown variant"):
            parse_variant(name)


def test_eager_variants_agree_and_are_timed(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", str(tiny_model_dir), "--variants", "eager,eager,int8-eager", "--num-requests", "3"]
    main([*args, "--prompt-len", "8", "--rounds", "2", "--decode-steps", "2", "--num-threads", "1"])
    out = capsys.readouterr().out
    assert "ms/decode step" in out
    # The same weights and format give the same greedy tokens: the agreement line says so.
    assert "eager: 3/3 requests identical over 5 tokens" in out
    assert "int8-eager: " in out
