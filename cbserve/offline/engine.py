"""The engine core in one thread: the batcher's `Scheduler` and the worker's `ModelRunner`, no Redis.

One `step()` is one iteration of the pipeline (vLLM's EngineCore.step, nano-vllm's LLMEngine.step):
schedule the worker's next step, run it, apply its result; the token events are those the worker
would publish. Under async scheduling (vLLM's step_with_batch_queue) a second step is scheduled and
launched before the first one's result is read, so the host prepares it while the device runs the
first (gpu_worker/runner/step/launched.py); the results are applied in order, one per `step()`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from batcher.core.request import Request
from batcher.core.scheduler import Scheduler, SchedulerConfig, SchedulerStats
from common.protocol import (
    GenerateRequest,
    LoRARequest,
    MultiModalFeature,
    PoolingParams,
    SamplingParams,
    WorkerEvent,
)
from gpu_worker.runner.step.launched import StepHandle
from gpu_worker.runner.step_runner import StepRunner, make_runner
from gpu_worker.settings import WorkerSettings


@dataclass(slots=True)
class EngineStep:
    events: Sequence[WorkerEvent] = field(default_factory=list)  # what the worker would stream
    # Requests that ended in this step: by their finish_reason, "error" (with .error) when they failed.
    finished: list[Request] = field(default_factory=list)
    ran: bool = False  # a forward ran (False: nothing could be scheduled)


class LLMEngine:
    def __init__(self, runner: StepRunner, config: SchedulerConfig) -> None:
        self.runner = runner
        self.scheduler = Scheduler(config)
        self.worker_id = runner.worker_id  # results carry it: the scheduler matches them by it
        self.info = runner.worker_info()  # what it serves: generation, or pooling tasks
        self.scheduler.add_worker(self.info)
        self._launched: deque[StepHandle] = deque()  # steps launched whose results are not applied

    @classmethod
    def load(cls, settings: WorkerSettings, config: SchedulerConfig) -> LLMEngine:
        """The model loaded as the worker loads it (`python -m gpu_worker`), under `config`'s scheduling."""
        return cls(make_runner(settings), config)

    @property
    def stats(self) -> SchedulerStats:
        return self.scheduler.stats

    @property
    def max_model_len(self) -> int:
        return self.runner.max_model_len

    def add_request(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        lora_request: LoRARequest | None = None,
        mm_features: list[MultiModalFeature] | None = None,
    ) -> None:
        now = time.time()
        req = Request(
            req_id,
            list(prompt_token_ids),
            params,
            arrival_time=now,
            entry_id="",
            lora_request=lora_request,
            mm_features=mm_features,
        )
        self.scheduler.add_request(req, now)

    def add_pooling_request(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: PoolingParams,
        token_type_ids: list[int] | None = None,
    ) -> None:
        """A request for a pooling model (runner pooling), read as the batcher reads one from Redis."""
        now = time.time()
        message = GenerateRequest(
            req_id=req_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=SamplingParams(),
            arrival_time=now,
            pooling_params=params,
            token_type_ids=token_type_ids,
        )
        self.scheduler.add_request(Request.from_message(message, entry_id=""), now)

    def abort_request(self, req_id: str, reason: str = "abort") -> None:
        """Stop a request still running ("stop": a stop string ended it, as the gateway says it)."""
        if req_id in self.scheduler.requests:
            self.scheduler.abort_request(req_id, reason, time.time())

    def has_unfinished_requests(self) -> bool:
        return bool(self.scheduler.requests) or bool(self._launched)

    def has_prompts_to_compute(self) -> bool:
        """Whether a request waits or has prompt tokens not yet computed: while it holds, steps carry
        prefill chunks (a benchmark times the decode-only steps after)."""
        running = self.scheduler.workers[self.worker_id].running
        return bool(self.scheduler.waiting) or any(
            req.num_computed_tokens < len(req.prompt_token_ids) for req in running
        )

    def step(self) -> EngineStep:
        failed: list[Request] = []
        while len(self._launched) < self.scheduler.config.max_steps_in_flight:
            out, failed_now = self.scheduler.schedule(self.worker_id)
            failed += failed_now
            if out is None:
                break
            self._launched.append(self.runner.launch(out))
        if not self._launched:
            return EngineStep(finished=failed)
        handle = self._launched.popleft()
        finished = self.scheduler.update_from_output(handle.get_output())
        return EngineStep(handle.events, [*failed, *finished], ran=True)
