"""A whole stack of its own for the load scripts: a private redis-server, batcher, workers, one gateway."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.models.tiny_model import build_tiny_model
from harness.processes.redis_server import redis_server
from harness.processes.services import Stack


@contextlib.contextmanager
def private_stack(
    model: Path | None,
    *,
    num_workers: int = 1,
    env: dict[str, str] | None = None,
    batcher_env: dict[str, str] | None = None,
    gateway_env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """Started and ready (`model`, or the tests' tiny model built in a temporary directory); `env`
    goes to every service. Everything stops, and the temporary directory goes, on exit."""
    shared = env or {}
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as url:
        stack = Stack(
            redis_url=url, model_dir=model or build_tiny_model(Path(tmp) / "tiny-llama"), log_dir=Path(tmp)
        )
        try:
            stack.start_batcher(**{**shared, **(batcher_env or {})})
            for i in range(num_workers):
                stack.start_worker(f"worker{i}", **shared)
            stack.start_gateway(**{**shared, **(gateway_env or {})})
            stack.wait_ready(num_workers=num_workers)
            yield stack
        finally:
            stack.stop()
