"""Only the worker imports torch: importing and building the gateway must not pull it (or transformers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHECK = """
import sys
from gateway.app import create_app
from gateway.settings import GatewaySettings
import gateway.__main__
app = create_app(GatewaySettings(model=sys.argv[1]))
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("heavy:", heavy)
sys.exit(1 if heavy else 0)
"""


def test_gateway_does_not_import_torch(tiny_model_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK, str(tiny_model_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "heavy: []" in result.stdout
