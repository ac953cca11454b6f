"""benchmarks/worker_step/gemm_paths.py: every GEMM path computes the same product as F.linear."""

from __future__ import annotations

import pytest
import torch

from benchmarks.worker_step.gemm_paths import main, paths


def test_each_path_computes_the_linear() -> None:
    x, weight = torch.randn(5, 32), torch.randn(48, 32) * 32**-0.5
    reference = torch.nn.functional.linear(x, weight)
    for name, call in paths(x, weight).items():
        tolerance = 0.05 if name.startswith("int8") else 1e-4  # int8 is close, fp32 paths equal-ish
        assert torch.allclose(call(), reference, atol=tolerance), name


def test_the_report_names_every_path(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--hidden", "32", "--intermediate", "64", "--vocab", "100", "--rows", "4", "--threads", "1",
          "--rounds", "2", "--repeats", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("onednn packed") == 5 and out.count("int8 _int_mm") == 5
