"""The pooling runner of a causal model (decoder embedding models, decoder classifiers and rerankers):
the generating `ModelRunner` with its KV cache, chunked prefill and prefix caching, whose step pools
instead of sampling.

Every request it holds is a pooling request (the batcher sends it no other). A step's forward keeps
the rows each request's pooling needs (causal_model.py returns hidden states, or a head's logits, at
them): its last prompt token's once its prompt is complete (last), every prompt token's (mean:
summed here over the chunks, which is why the worker tells the batcher to reuse no cached prefix), or
the first token's (cls). The step that completes a prompt ends the request, as a request of
max_tokens 0 ends (the batcher plans it so); its `PoolingEvent` replaces the token events.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from common.protocol import ModelRunnerOutput, PoolingParams, SchedulerOutput, WorkerEvent, WorkerInfo
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.input_batch import InputBatch
from gpu_worker.runner.load_model import Model
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.runner.pooling.causal_model import load_causal_pooling_model
from gpu_worker.runner.pooling.model_files import PoolingSpec
from gpu_worker.runner.pooling.pooled_output import pooled_values, pooling_event
from gpu_worker.runner.step.sampling import LaunchedSample, SampledStep
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)


class PoolingModelRunner(ModelRunner):
    def __init__(self, settings: WorkerSettings, spec: PoolingSpec) -> None:
        if settings.speculative_config is not None or settings.null_model:
            raise ValueError(
                "a pooling model samples nothing: unset WORKER_SPECULATIVE_CONFIG and WORKER_NULL_MODEL"
            )
        self.spec = spec
        self._params: dict[str, PoolingParams] = {}  # of every request held
        self._partial: dict[str, torch.Tensor] = {}  # mean: the sum of its chunks so far; cls: its first row
        self._pooled: dict[
            str, torch.Tensor
        ] = {}  # requests whose prompt ended: their values, until published
        # No decode steps to capture: a pooling request's steps are all prefill.
        super().__init__(settings.model_copy(update={"cuda_graphs": False}))

    def _load_model(self, settings: WorkerSettings) -> Model:
        return load_causal_pooling_model(settings, self.spec)

    def worker_info(self) -> WorkerInfo:
        return self.spec.worker_info(super().worker_info())

    def reset(self) -> None:
        super().reset()
        self._params.clear()
        self._partial.clear()
        self._pooled.clear()

    def _apply(self, so: SchedulerOutput, req_errors: dict[str, str]) -> None:
        super()._apply(so, req_errors)
        for new in so.scheduled_new_reqs:
            if new.req_id not in self.requests:
                continue  # refused by the checks
            params = self.spec.params_of(new.pooling_params)
            if params.task not in self.spec.tasks:
                tasks = ", ".join(self.spec.tasks)
                self._fail_or(req_errors, new.req_id, f"the model serves {tasks}, not {params.task}")
            else:
                self._params[new.req_id] = params

    def _drop(self, req_id: str) -> None:
        super()._drop(req_id)
        self._params.pop(req_id, None)
        self._partial.pop(req_id, None)
        self._pooled.pop(req_id, None)

    def _sample(self, batch: InputBatch) -> LaunchedSample:
        """The forward at the rows the requests pool; each request whose prompt is complete gets its
        values, and the placeholder token 0 that ends it."""
        rows, spans = self._rows(batch)
        kept = torch.tensor(rows, dtype=torch.long).to(self.device)
        out = self.model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            use_cache=False,
            logits_to_keep=kept,
            attn_metadata=batch.attn_metadata,
        ).logits[0]
        partial: dict[str, torch.Tensor] = {}
        pooled: dict[str, torch.Tensor] = {}
        for req_id, (first, count, complete) in spans.items():
            state = self.requests[req_id]
            taken = out[first : first + count].float()
            if self.spec.pooling_type == "mean":
                total: torch.Tensor | None = taken.sum(0) + self._partial.get(req_id, 0.0)
            elif self.spec.pooling_type == "cls":
                total = taken[0] if count else self._partial[req_id]
            else:
                total = None  # last: only the step that completes the prompt keeps a row
            if not complete:
                if total is not None:
                    partial[req_id] = total
                continue
            if total is None:
                raw = taken[-1]
            else:
                raw = total / state.num_prompt_tokens if self.spec.pooling_type == "mean" else total
            pooled[req_id] = pooled_values(raw, self._params[req_id], self.spec)
        # Kept only now that the whole step ran: a step that raises is rerun without doubling a sum.
        self._partial.update(partial)
        self._pooled.update(pooled)
        return LaunchedSample.read(SampledStep([0] * len(batch.sampling_reqs), {}, {}, {}))

    def _rows(self, batch: InputBatch) -> tuple[list[int], dict[str, tuple[int, int, bool]]]:
        """The flat rows to keep, and per request (first kept row, how many, prompt complete)."""
        starts = batch.attn_metadata.common.query_start_loc_cpu.tolist()
        complete = {r.state.req_id for r in batch.sampling_reqs}
        rows: list[int] = []
        spans: dict[str, tuple[int, int, bool]] = {}
        for r, start in zip(batch.scheduled, starts, strict=False):
            req_id = r.state.req_id
            done = req_id in complete
            if self.spec.pooling_type == "mean":
                taken = list(range(start, start + r.num_tokens))
            elif self.spec.pooling_type == "cls":
                taken = [start] if r.state.num_computed_tokens == 0 else []
            else:
                taken = [start + r.num_tokens - 1] if done else []
            spans[req_id] = (len(rows), len(taken), done)
            rows += taken
        return rows, spans

    def _events(
        self, output: ModelRunnerOutput, states: Mapping[str, CachedRequestState], *_: object
    ) -> list[WorkerEvent]:
        """One `PoolingEvent` per request that ended in the step (no token events, no logprobs)."""
        events: list[WorkerEvent] = []
        for req_id in output.req_ids:
            state = states[req_id]
            values = self._pooled.pop(req_id)
            events.append(
                pooling_event(req_id, state.attempt, values, state.num_prompt_tokens, state.num_cached_tokens)
            )
        return events
