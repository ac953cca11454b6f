"""Defaults shared by the command line and the launcher, importable without loading either."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

REPO_ROOT = Path(__file__).resolve().parent.parent
# The demo model shipped with the repository; `make run` serves it when no model is named.
DEFAULT_MODEL_DIR = REPO_ROOT / "models" / "demo"
# Model loading on a slow CPU (or a first hub download) can take minutes; a dead child fails at once.
DEFAULT_READY_TIMEOUT_S = 600.0
# A service that dies is started again, up to this many times within the window (cbserve/restarts.py).
DEFAULT_MAX_RESTARTS = 5
DEFAULT_RESTART_WINDOW_S = 600.0
DEFAULT_BASE_URL = "http://127.0.0.1:8000"
# A completion has no end of turn to stop at: without a bound it runs to the context's end (the demo
# model's 1024 tokens, ending in template text). A few sentences, unless --max-tokens says otherwise.
DEFAULT_COMPLETE_MAX_TOKENS = 64

RedisMode = Literal["auto", "url", "binary", "embedded"]
REDIS_MODES: tuple[RedisMode, ...] = ("auto", "url", "binary", "embedded")


def default_model(env: Mapping[str, str]) -> str:
    """`MODEL` when set (the variable the services read too), else the repository's demo model."""
    return env.get("MODEL") or str(DEFAULT_MODEL_DIR)
