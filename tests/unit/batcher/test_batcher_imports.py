"""Only the worker imports torch: the batcher (and the shared code) must not pull it in."""

from __future__ import annotations

from harness.processes.fresh_python import heavy_imports


def test_batcher_does_not_import_torch() -> None:
    check = "import batcher.__main__, batcher.service.loop, common.protocol, common.finish"
    assert heavy_imports(check, timeout=60) == []
