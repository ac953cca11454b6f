"""The profiling step: the largest step the batcher may send, run once before the worker registers.

As vLLM's profile run: `max_num_batched_tokens` prompt tokens spread over `max_num_seqs` new requests,
each sampling a token with every sampling feature on, built as a SchedulerOutput and executed by the
ModelRunner through the path every step takes, in a small temporary KV pool. On cuda its peak memory
sizes the KV cache: `total * gpu_memory_utilization - (weights + peak activations + non-torch memory
+ reserve)`, vLLM's definition. On every device it proves the worst-case step runs. LoRA slots
(WORKER_ENABLE_LORA) are allocated with the decoder, so they count with the weights, and every step
computes the adapted linears' deltas with the same shapes whichever adapters it runs (the profiling
step runs none), so their activations are in the peak.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Protocol

import torch

from common.protocol import ModelRunnerOutput, NewRequestData, SamplingParams, SchedulerOutput
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

GIB = 1 << 30
MIB = 1 << 20

# Every feature the sampler has, so its buffers are in the peak: filters, penalties, logprobs (20 is
# the gateway's most). A seed per request leaves the worker's shared generator untouched.
_PROFILE_PARAMS = {
    "max_tokens": 1,
    "temperature": 1.0,
    "top_p": 0.9,
    "top_k": 50,
    "min_p": 0.05,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.1,
    "repetition_penalty": 1.1,
    "logprobs": 20,
}


class ProfiledRunner(Protocol):
    """What the profiling step uses of the ModelRunner, which runs it from its __init__ (named here
    rather than imported: model_runner.py imports this file)."""

    device: torch.device
    num_isolated_steps: int

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...

    def reset(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ProfileStep:
    scheduler_output: SchedulerOutput
    num_blocks: int  # the temporary pool it needs
    max_len: int  # its longest request


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """What cuda memory looked like before the model was loaded (other processes included)."""

    free: int
    total: int

    @classmethod
    def take(cls, device: torch.device) -> MemorySnapshot | None:
        if device.type != "cuda":
            return None
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        return cls(free=free, total=total)


@dataclass(frozen=True, slots=True)
class ProfileResult:
    num_reqs: int
    num_tokens: int
    seconds: float
    peak_activation_bytes: int  # above what was allocated before the step; 0 off cuda


def build_profile_step(settings: WorkerSettings, model_max_len: int) -> ProfileStep:
    """`max_num_batched_tokens` spread evenly over `max_num_seqs` prompts, each at most `model_max_len`.

    A step can never hold more than `max_num_seqs` requests of the longest allowed length, so the
    budget is cut there.
    """
    num_reqs = settings.resolved_max_num_seqs
    longest = settings.max_model_len or model_max_len
    num_tokens = min(settings.resolved_max_num_batched_tokens, num_reqs * longest)
    base, remainder = divmod(num_tokens, num_reqs)
    lengths = [base + (1 if i < remainder else 0) for i in range(num_reqs)]
    new_reqs, next_block = [], 0
    for i, length in enumerate(lengths):
        num_blocks = -(-length // settings.block_size)
        new_reqs.append(
            NewRequestData(
                req_id=f"profile-{i}",
                prompt_token_ids=[0] * length,  # any token id runs the same kernels
                output_token_ids=[],
                sampling_params=SamplingParams(seed=i, **_PROFILE_PARAMS),  # type: ignore[arg-type]
                block_ids=list(range(next_block, next_block + num_blocks)),
                num_computed_tokens=0,
                attempt=1,
            )
        )
        next_block += num_blocks
    scheduler_output = SchedulerOutput(
        step_id=0,
        scheduled_new_reqs=new_reqs,
        scheduled_cached_reqs=[],
        num_scheduled_tokens={r.req_id: len(r.prompt_token_ids) for r in new_reqs},
        total_num_scheduled_tokens=num_tokens,
        finished_req_ids=[],
    )
    return ProfileStep(scheduler_output=scheduler_output, num_blocks=next_block, max_len=max(lengths))


def run_profile_step(runner: ProfiledRunner, step: ProfileStep) -> ProfileResult:
    """Execute the step on `runner` (its pool must hold `step.num_blocks`), then forget its requests."""
    so = step.scheduler_output
    cuda = runner.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(runner.device)
        torch.cuda.reset_peak_memory_stats(runner.device)
    before = torch.cuda.memory_allocated(runner.device) if cuda else 0
    logger.info("profiling memory with the largest step the batcher may send")
    isolated = runner.num_isolated_steps
    started = time.perf_counter()
    output = runner.execute_model(so)
    if cuda:
        torch.cuda.synchronize(runner.device)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(runner.device) - before if cuda else 0
    runner.reset()
    failed = next(iter(output.req_errors.values()), None)
    if failed is None and runner.num_isolated_steps != isolated:
        failed = "the whole step raised (its requests passed one at a time: see the log)"
    if failed is None and len(output.req_ids) != len(so.scheduled_new_reqs):
        failed = f"{len(output.req_ids)} of {len(so.scheduled_new_reqs)} requests sampled a token"
    if failed is not None:
        raise ValueError(
            f"the profiling step ({len(so.scheduled_new_reqs)} requests, "
            f"{so.total_num_scheduled_tokens} tokens) failed: {failed}; lower WORKER_MAX_NUM_SEQS "
            "or WORKER_MAX_NUM_BATCHED_TOKENS"
        )
    return ProfileResult(
        num_reqs=len(so.scheduled_new_reqs),
        num_tokens=so.total_num_scheduled_tokens,
        seconds=seconds,
        peak_activation_bytes=peak,
    )


def kv_cache_budget(
    settings: WorkerSettings, device: torch.device, start: MemorySnapshot | None, profile: ProfileResult
) -> int:
    """Bytes for the KV cache; on cuda, call it with the temporary pool freed. Logs the breakdown."""
    head = (
        f"profiling step: {profile.num_reqs} requests, {profile.num_tokens} tokens in {profile.seconds:.2f} s"
    )
    if settings.num_blocks is not None:
        logger.info("%s; KV cache %d blocks (WORKER_NUM_BLOCKS)", head, settings.num_blocks)
        return 0  # unused: the setting wins
    if start is None:
        budget = settings.kv_cache_memory_mb * MIB
        logger.info("%s; KV cache %d MiB (WORKER_KV_CACHE_MEMORY_MB)", head, settings.kv_cache_memory_mb)
        return budget
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    memory = GpuMemoryBudget(
        total=total,
        free_at_start=start.free,
        utilization=settings.gpu_memory_utilization,
        weights=torch.cuda.memory_allocated(device),  # the model and the runner's persistent buffers
        activations=profile.peak_activation_bytes,
        # Taken outside torch's allocator since startup (CUDA context growth, libraries).
        non_torch=max(0, (total - free) - (start.total - start.free) - torch.cuda.memory_reserved(device)),
        reserve=settings.gpu_reserve_memory_mb * MIB,
    )
    logger.info("%s; %s", head, memory.describe())
    return memory.kv_cache()


@dataclass(frozen=True, slots=True)
class GpuMemoryBudget:
    """vLLM's split of the worker's share of the GPU; bytes."""

    total: int
    free_at_start: int  # before loading: what other processes left
    utilization: float
    weights: int
    activations: int  # the profiling step's peak
    non_torch: int
    reserve: int

    @property
    def requested(self) -> int:
        return int(self.total * self.utilization)

    @property
    def left(self) -> int:
        """The worker's share minus everything but the KV cache; negative when it does not fit."""
        return self.requested - self.weights - self.activations - self.non_torch - self.reserve

    def kv_cache(self) -> int:
        """What is left for the KV cache (0 when nothing is); refuses a share others already hold."""
        if self.requested > self.free_at_start:
            raise ValueError(
                f"WORKER_GPU_MEMORY_UTILIZATION={self.utilization} asks for {self.requested / GIB:.1f} GiB "
                f"of the GPU's {self.total / GIB:.1f} GiB, but only {self.free_at_start / GIB:.1f} GiB were "
                "free at startup (other processes hold the rest): lower it"
            )
        return max(0, self.left)

    def describe(self) -> str:
        return (
            f"GPU memory {self.total / GIB:.2f} GiB x {self.utilization:.2f} = "
            f"{self.requested / GIB:.2f} GiB for this worker: weights {self.weights / GIB:.2f}, "
            f"activations {self.activations / GIB:.2f}, non-torch {self.non_torch / GIB:.2f}, "
            f"reserve {self.reserve / GIB:.2f}, KV cache {max(0, self.left) / GIB:.2f} GiB"
        )
