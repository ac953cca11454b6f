"""Garbage collection for the long-running services: fewer and cheaper collections on the hot path.

Every step allocates short-lived objects per token (events, tuples, lists, futures). With CPython's
default gen0 threshold (700) a young collection runs several times a step, and each older one walks
every object alive since startup (tokenizers, the model's modules, the app) again. After startup the
gateway, batcher and worker freeze what startup made (`gc.freeze`: the collector never walks it
again) and collect gen0 every GEN0_THRESHOLD allocations, as vLLM's engine freezes its startup heap
(docs/benchmarks.md, issue 40's target, has the measurement).
"""

from __future__ import annotations

import gc
from typing import Final

GEN0_THRESHOLD: Final = 50_000


def tune_gc() -> None:
    """Call once, after startup: collect, freeze what is left, raise gen0's threshold."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
