"""The `LLM` these tests build: on the CPU, one torch thread, with the settings each test names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cbserve import LLM


def cpu_llm(model_dir: Path, **settings: Any) -> LLM:
    torch.set_num_threads(1)
    return LLM(str(model_dir), device="cpu", **settings)
