"""The step's input tensors in buffers allocated once, at the worker's largest step (vLLM v1's
persistent input batch): a step writes the used prefix of each on the host, with numpy (a numpy op
on a few hundred ints costs a microsecond, a torch op several), and copies it to the device with one
non-blocking copy per buffer (host_copies.py). On the CPU host and device are one tensor.

A step's tensors are views of these buffers, valid until the next step writes them. On CUDA the
host waits, before writing, for the last step's copies out of them (an event), so a pinned buffer is
never overwritten while its copy may be in flight.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gpu_worker.runner.host_copies import CpuGpuBuffer, new_event


class StepInputBuffers:
    def __init__(
        self, max_num_reqs: int, max_num_tokens: int, max_num_blocks: int, device: torch.device
    ) -> None:
        self.device = device
        self._allocate(max(1, max_num_reqs), max(1, max_num_tokens), max(1, max_num_blocks))
        self._copied: Any = None  # the event after the last step's copies (CUDA only)

    def _allocate(self, num_reqs: int, num_tokens: int, num_blocks: int) -> None:
        self.max_num_reqs, self.max_num_tokens, self.max_num_blocks = num_reqs, num_tokens, num_blocks
        device, long, int32 = self.device, torch.long, torch.int32
        self.input_ids = CpuGpuBuffer((num_tokens,), long, device)
        self.positions = CpuGpuBuffer((num_tokens,), long, device)
        self.slot_mapping = CpuGpuBuffer((num_tokens,), long, device)
        self.lora_ids = CpuGpuBuffer((num_tokens,), long, device)
        self.query_start_loc = CpuGpuBuffer((num_reqs + 1,), int32, device)
        self.seq_lens = CpuGpuBuffer((num_reqs,), int32, device)
        # Flat, so that a step's [B, its widest row] table is a contiguous prefix (the CPU op wants it).
        self.block_tables = CpuGpuBuffer((num_reqs * num_blocks,), int32, device)
        self.logits_indices = CpuGpuBuffer((num_reqs,), long, device)
        # Rare rows (drafts to verify, prompt logprobs): at most one per token.
        self.spec_indices = CpuGpuBuffer((num_tokens,), long, device)
        self.prompt_indices = CpuGpuBuffer((num_tokens,), long, device)
        self.prompt_targets = CpuGpuBuffer((num_tokens,), long, device)
        self.arange: np.ndarray[Any, Any] = np.arange(
            max(num_tokens, num_reqs + 1, num_blocks), dtype=np.int64
        )

    def begin(self, num_reqs: int, num_tokens: int, num_blocks: int) -> None:
        """Before a step writes its inputs: the buffers free to write and large enough for it."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None
        sizes = (self.max_num_reqs, self.max_num_tokens, self.max_num_blocks)
        needed = (num_reqs, num_tokens, num_blocks)
        if any(n > size for n, size in zip(needed, sizes, strict=True)):
            # A step past the sizes the worker was configured with (the profiling step, a draft
            # model's growing contexts): grown by doubling, so that it happens rarely.
            self._allocate(
                *(size if n <= size else max(n, 2 * size) for n, size in zip(needed, sizes, strict=True))
            )

    def end(self) -> None:
        """After a step queued its copies."""
        self._copied = new_event(self.device)
        if self._copied is not None:
            self._copied.record()

    def upload(self, buffer: CpuGpuBuffer, values: list[int]) -> torch.Tensor:
        """`values` written into the head of `buffer`, on the device."""
        n = len(values)
        buffer.np[:n] = values
        return buffer.copy_to_gpu(n)
