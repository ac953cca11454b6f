"""The worker's settings: where its model comes from, and errors that say which variable to set."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpu_worker.settings import WorkerSettings, explain_errors


def test_settings_say_what_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MODEL", "WORKER_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValidationError, match="--model"):
        WorkerSettings()
    monkeypatch.setenv("MODEL", "/models/a")
    assert WorkerSettings().model == "/models/a"
    monkeypatch.setenv("WORKER_MODEL", "/models/b")
    assert WorkerSettings().model == "/models/b"  # the worker's own variable wins over the shared one
    assert WorkerSettings(model="/models/c").model == "/models/c"  # and the CLI over both
    with pytest.raises(ValidationError) as bad_dtype:
        WorkerSettings(dtype="float8")
    assert "set WORKER_DTYPE" in explain_errors(bad_dtype.value)
    monkeypatch.setenv("WORKER_DEVICE", "cuda")
    assert WorkerSettings().resolved_dtype == "bfloat16"
