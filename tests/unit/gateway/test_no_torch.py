"""Only the worker imports torch: importing and building the gateway must not pull it (or transformers)."""

from __future__ import annotations

from pathlib import Path

from harness.processes.fresh_python import heavy_imports

CHECK = """
import sys
from gateway.app import create_app
from gateway.settings import GatewaySettings
import gateway.__main__
app = create_app(GatewaySettings(model=sys.argv[1]))
"""


def test_gateway_does_not_import_torch(tiny_model_dir: Path) -> None:
    assert heavy_imports(CHECK, str(tiny_model_dir)) == []
