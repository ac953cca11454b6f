"""Only the worker imports torch: the batcher (and the shared code) must not pull it in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHECK = """
import sys
import batcher.__main__, batcher.service.loop, common.protocol, common.finish
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("heavy:", heavy)
sys.exit(1 if heavy else 0)
"""


def test_batcher_does_not_import_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "heavy: []" in result.stdout
