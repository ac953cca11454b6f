"""What every runner announces of itself when its worker registers (`WorkerInfo`)."""

from __future__ import annotations

import time
from typing import Any, Protocol

from common.protocol import WorkerInfo


class RunnerSizes(Protocol):
    worker_id: str
    model_name: str
    num_blocks: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int


def worker_info_of(runner: RunnerSizes, **extra: Any) -> WorkerInfo:
    """`runner`'s pool and step limits, and the `extra` fields of its kind."""
    return WorkerInfo(
        worker_id=runner.worker_id,
        model=runner.model_name,
        num_blocks=runner.num_blocks,
        block_size=runner.block_size,
        max_model_len=runner.max_model_len,
        started_at=time.time(),
        max_num_seqs=runner.max_num_seqs,
        max_num_batched_tokens=runner.max_num_batched_tokens,
        **extra,
    )
