"""How a step becomes a CUDA graph: warmed up on a side stream, then captured into a memory pool
that every graph of one `CudaGraphCapture` shares (decode.py and piecewise.py decide which
steps, and what a failed capture means; the draft model's loop, spec_decode/draft_loop.py, has a
capture of its own).

`DecodeGraphs`, `PiecewiseGraphs` and the draft loop take any `GraphCapture`: `CudaGraphCapture` on a
GPU; the tests' fake device (harness/gpu_worker/fake_cuda.py) captures by running the step under the
rules a capture enforces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

Step = Callable[[], None]


class Graph(Protocol):
    def replay(self) -> None: ...


class GraphCapture(Protocol):
    def warm_up(self, step: Step) -> None:
        """Run `step` eagerly before its capture (lazy inits, autotuning and JIT compiles happen
        here, not in the graph); an error here is the step's own."""
        ...

    def capture(self, step: Step) -> Graph:
        """`step` recorded as a graph; raises RuntimeError where the device refuses the capture."""
        ...

    def memory_used(self) -> int:
        """Bytes of device memory the graphs took so far."""
        ...


class CudaGraphCapture:
    """Captures on the current CUDA device, every graph in one memory pool (as torch's docs ask:
    warm-up on a side stream, capture with the pool shared, largest graph first)."""

    def __init__(self) -> None:
        self._free_at_start = torch.cuda.mem_get_info()[0]
        self._pool = torch.cuda.graph_pool_handle()
        self._stream = torch.cuda.Stream()

    def warm_up(self, step: Step) -> None:
        self._stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._stream):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(self._stream)

    def capture(self, step: Step) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                step()
        finally:
            # torch.cuda.graph's exit ends the capture before it restores the stream: where ending
            # an invalidated capture raises, the capture's side stream would stay current.
            torch.cuda.set_stream(stream)
        return graph

    def memory_used(self) -> int:
        torch.cuda.synchronize()
        return self._free_at_start - torch.cuda.mem_get_info()[0]
