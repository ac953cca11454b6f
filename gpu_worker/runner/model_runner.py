"""ModelRunner: applies a SchedulerOutput, runs one forward over the ragged batch, samples.

It keeps per-request state between steps (token ids, block table, computed count), so the batcher
only sends diffs. A step is all or nothing: if it raises, the new requests and block-table extensions
it brought are undone (its frees stay done) and it is rerun one request at a time, so a poison request
fails alone (in `req_errors`) while the rest of the batch gets its tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from common.lora.lora_adapter import BaseModelShapes
from common.protocol import (
    LoRARequest,
    ModelRunnerOutput,
    SchedulerOutput,
    WorkerEvent,
    WorkerInfo,
)
from gpu_worker.runner.attention.backend import AttentionBackend
from gpu_worker.runner.block_table import BlockTable
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.graphs.decode import DecodeGraphs
from gpu_worker.runner.graphs.piecewise import PiecewiseGraphs
from gpu_worker.runner.input_batch import InputBatch, ScheduledRequest, build_input_batch
from gpu_worker.runner.kv_cache import KVCache
from gpu_worker.runner.kv_cache_sizing import size_kv_cache, use_kv_cache
from gpu_worker.runner.load_model import Model, eos_token_ids, load_model, model_max_len
from gpu_worker.runner.lora.manager import LoRAManager
from gpu_worker.runner.multimodal.mm_step import MultiModalInputs, add_images
from gpu_worker.runner.multimodal.vision_model import VisionLanguageModel
from gpu_worker.runner.profile import MemorySnapshot, build_profile_step
from gpu_worker.runner.runner_info import worker_info_of
from gpu_worker.runner.sample.logprobs import SampleLogprobs
from gpu_worker.runner.sample.sampler import Sampler
from gpu_worker.runner.sample.sampling_state import SamplingState
from gpu_worker.runner.spec_decode.draft_model import DraftModelProposer
from gpu_worker.runner.step.checks import check_cached, check_new, check_scheduled
from gpu_worker.runner.step.forward import capture_graphs, forward_logits
from gpu_worker.runner.step.hooks import with_step_hooks
from gpu_worker.runner.step.isolation import StepFailed, isolate, rollback, undo_log
from gpu_worker.runner.step.launched import FinishedStep, LaunchedStep, LaunchedSteps, StepHandle
from gpu_worker.runner.step.output import advance, reserve, token_events
from gpu_worker.runner.step.sampling import LaunchedSample, SampledStep, launch_sample_step
from gpu_worker.runner.step_input_buffers import StepInputBuffers
from gpu_worker.runner.structured_output.matchers import StructuredOutputs
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)


class ModelRunner:
    # The pool and the backends that read it, set by use_kv_cache (kv_cache_sizing.py).
    kv_cache: KVCache
    attn_backend: AttentionBackend[Any]
    mask_backend: AttentionBackend[Any]

    def __init__(self, settings: WorkerSettings, model: Model | None = None) -> None:
        """`model`: one already built on the device (benchmarks); by default loaded from settings.model."""
        self.worker_id = settings.worker_id
        self.model_name = settings.model
        self.device = torch.device(settings.device)
        memory_at_start = MemorySnapshot.take(self.device)
        self.model: Model = self._load_model(settings) if model is None else model
        config = self.model.config
        # A vision-language model's images: their tensors, the encoder cache (multimodal/).
        self.mm = (
            MultiModalInputs(self.model, settings.encoder_cache_size, self.device)
            if isinstance(self.model, VisionLanguageModel)
            else None
        )
        self.block_size = settings.block_size
        self.max_num_seqs = settings.resolved_max_num_seqs
        self.max_num_batched_tokens = settings.resolved_max_num_batched_tokens
        # A temporary pool just large enough for the profiling step, run at the end of __init__.
        profile = build_profile_step(settings, model_max_len(config) or self.max_num_batched_tokens)
        self.num_blocks = profile.num_blocks
        self.max_model_len = profile.max_len
        self._attention_backend_name = settings.resolved_attention_backend
        self._group_decodes = settings.resolved_group_decodes
        self._cascade_attention = settings.resolved_cascade_attention
        self._kv_cache_dtype: torch.dtype = getattr(torch, settings.resolved_kv_cache_dtype)
        use_kv_cache(self, self.num_blocks)
        self.vocab_size = int(config.get_text_config().vocab_size)
        self.eos_token_ids = eos_token_ids(self.model)
        self.sampler = Sampler(settings.seed, self.device)
        # Sampling parameters and penalty counts of every held request, kept on the device.
        self.sampling_state = SamplingState(self.vocab_size, self.device, self.eos_token_ids)
        # Grammar matchers of the requests with structured outputs (tokenizer loaded on first use).
        self.structured_outputs = StructuredOutputs(
            settings.model, self.vocab_size, self.eos_token_ids, self.device
        )
        spec = settings.speculative_config
        self.draft_model: DraftModelProposer | None = None
        if spec is not None and spec.model is not None:
            self.draft_model = DraftModelProposer(settings, spec.model, self.vocab_size)
        # The real forward and sampling, or a test/benchmark stand-in chosen once (step/hooks.py).
        self._sample_step = with_step_hooks(settings, self._sample)
        self.requests: dict[str, CachedRequestState] = {}
        # The adapters in host memory and in the decoder's slots (WORKER_ENABLE_LORA); None without.
        self.lora = self._lora_manager(settings)
        self.block_table = BlockTable(self.max_num_seqs, -(-self.max_model_len // self.block_size))
        # The step's input tensors, written in place each step (step_input_buffers.py).
        self.step_inputs = StepInputBuffers(
            self.max_num_seqs, self.max_num_batched_tokens, self.block_table.table.shape[1], self.device
        )
        self._launched = LaunchedSteps(self.device)  # left on the device, not yet finished (launch)
        # Only where nothing reads a step's samples when it ends (drafts from them; images).
        self._samples_stay_on_device = self.draft_model is None and self.mm is None
        self._last_finished: FinishedStep | None = None  # of execute_model, for token_events
        self._last_finished_at = 0.0  # perf_counter when the last step was finished
        self.num_isolated_steps = 0  # steps that raised and were rerun request by request
        self.decode_graphs: DecodeGraphs | None = None  # none during the profiling step
        self.piecewise_graphs: PiecewiseGraphs | None = None
        size_kv_cache(self, settings, profile, memory_at_start)
        # Captured last, over the real pool: graphs hold the addresses of the pool and the weights.
        # A vision-language model's steps take embeddings, which the decode graphs do not.
        if settings.resolved_cuda_graphs and not settings.null_model and self.mm is None:
            self.decode_graphs, self.piecewise_graphs = capture_graphs(
                settings,
                self.model,
                self.attn_backend,
                max_num_seqs=self.max_num_seqs,
                max_model_len=self.max_model_len,
                max_num_batched_tokens=self.max_num_batched_tokens,
                device=self.device,
            )

    def _lora_manager(self, settings: WorkerSettings) -> LoRAManager | None:
        if not settings.enable_lora:
            return None
        if not isinstance(self.model, Decoder) or self.model.lora_config is None:
            raise ValueError("WORKER_ENABLE_LORA needs the worker's own decoder built with LoRA slots")
        return LoRAManager(
            self.model.lora_layers,
            BaseModelShapes.from_config(self.model.config.to_dict()),
            max_loras=settings.max_loras,
            max_lora_rank=settings.max_lora_rank,
            max_cpu_loras=settings.resolved_max_cpu_loras,
            dtype=self.model.dtype,
            device=self.device,
        )

    def _load_model(self, settings: WorkerSettings) -> Model:
        """The model the runner drives (the pooling runner loads its own: pooling/causal_runner.py)."""
        return load_model(settings)

    def worker_info(self) -> WorkerInfo:
        """What the batcher needs to schedule onto this runner (sent when a worker registers)."""
        return worker_info_of(
            self,
            max_loras=0 if self.lora is None else self.lora.max_loras,
            max_lora_rank=0 if self.lora is None else self.lora.max_lora_rank,
            max_cpu_loras=0 if self.lora is None else self.lora.max_cpu_loras,
            supports_multimodal=self.mm is not None,
            disable_chunked_mm_input=self.mm is not None and self.mm.model.bidirectional_images,
        )

    # ---- one step -------------------------------------------------------------------------------

    def launch(self, scheduler_output: SchedulerOutput) -> StepHandle:
        """Apply a step and queue it on the device. Its samples stay there when no row needs the host
        (step/sampling.py) and nothing reads them at its end (no draft model, no images): the next
        step's inputs take them on the device, and the host reads them when it finishes the step.
        Otherwise the step is finished before this returns, with every step launched before it."""
        started = time.perf_counter()
        try:
            launched = self._launch(scheduler_output)
        except StepFailed as failed:
            # Rare path: find the culprit instead of failing the whole batch (see step/isolation.py).
            logger.warning("step %d: rerunning it request by request (%s)", scheduler_output.step_id, failed)
            self.num_isolated_steps += 1
            self._launched.finish_all()  # the rerun reads what the steps before it sampled
            finished = isolate(self, scheduler_output)
            finished.output.step_time = time.perf_counter() - started
            return StepHandle.finished(finished)
        # Built and queued while an earlier step still runs: the overlap this exists for.
        launched.overlapped = bool(self._launched)
        handle = StepHandle(launched.sample, lambda: self._finish(handle, launched))
        tokens = launched.sample.token_ids
        if tokens is None or not self._samples_stay_on_device:
            handle.result()
        else:
            self._launched.add(handle, launched.batch, tokens)
        return handle

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step, launched and finished (offline callers, tests and benchmarks)."""
        self._last_finished = self.launch(scheduler_output).result()
        return self._last_finished.output

    def token_events(self, output: ModelRunnerOutput) -> Sequence[WorkerEvent]:
        """The token-stream events of the output `execute_model` returned last."""
        assert self._last_finished is not None and self._last_finished.output is output
        return self._last_finished.events

    def reset(self) -> None:
        """Forget every request (the batcher has moved them elsewhere); the pool is simply reused."""
        self._launched.finish_all()
        self.requests.clear()
        self.block_table.clear()
        self.sampling_state.clear()
        self.structured_outputs.clear()
        if self.mm is not None:
            self.mm.clear()
        if self.draft_model is not None:
            self.draft_model.clear()

    def _launch(self, scheduler_output: SchedulerOutput) -> LaunchedStep:
        """Apply, build and queue one step, all or nothing: on an exception its diff is rolled back
        and StepFailed raised."""
        started = time.perf_counter()
        req_errors: dict[str, str] = {}
        undo = undo_log(scheduler_output, self.requests)
        cache = None if self.mm is None else self.mm.encoder_cache
        encoder_counts = (0, 0) if cache is None else (cache.num_encoder_runs, cache.num_cache_hits)
        try:
            self._apply(scheduler_output, req_errors)
            scheduled = self._scheduled(scheduler_output, req_errors)
            # Gemma 3's image tokens see their whole image: such steps go through the torch backend's masks.
            image_runs = None if self.mm is None else self.mm.bidirectional_runs(scheduled)
            batch = build_input_batch(
                scheduled,
                self.mask_backend if image_runs else self.attn_backend,
                self.device,
                self.block_table,
                None if self.lora is None else self.lora.step_slots(scheduled),
                image_runs,
                self.step_inputs,
            )
            self._launched.take_tokens(batch)
            sample = self._forward_and_sample(batch)
        except Exception as exc:
            logger.exception("step %d failed", scheduler_output.step_id)
            rollback(undo, self.requests, self.block_table, self._drop)
            raise StepFailed(f"{type(exc).__name__}: {exc}") from exc
        placeholders = reserve(batch)
        return LaunchedStep(
            scheduler_output, batch, sample, placeholders, req_errors, started, encoder_counts
        )

    def _execute(self, scheduler_output: SchedulerOutput) -> FinishedStep:
        """One step launched and finished at once (the request-by-request rerun: step/isolation.py)."""
        return self._fill(self._launch(scheduler_output))

    def _finish(self, handle: StepHandle, launched: LaunchedStep) -> FinishedStep:
        self._launched.finish_before(handle)  # steps finish in launch order
        return self._fill(launched)

    def _fill(self, launched: LaunchedStep) -> FinishedStep:
        """Read a launched step's samples, advance its requests, and make its output and events."""
        so, batch = launched.scheduler_output, launched.batch
        step = launched.sample.result()
        self._launched.read(batch, launched.sample.token_ids)
        # A request that a step before this one ended was in this one too, launched before that
        # step finished: its row here computed nothing it keeps.
        kept = [i for i, r in enumerate(batch.sampling_reqs) if r.state.finish_reason is None]
        reqs = [batch.sampling_reqs[i] for i in kept]
        req_ids = [r.state.req_id for r in reqs]
        runs = [[*step.accepted.get(i, []), step.token_ids[k]] for i, k in zip(req_ids, kept, strict=True)]
        placeholders = [launched.placeholders[i] for i in kept]
        firsts = {
            r.state.req_id: p - r.state.num_prompt_tokens for r, p in zip(reqs, placeholders, strict=True)
        }
        finish_reasons = advance(
            reqs, placeholders, runs, self.eos_token_ids, self.max_model_len, step.grammar_ends
        )
        drafts: dict[str, list[int]] = {}  # the draft model's, for the next step of the requests that ask
        if self.draft_model is not None and so.draft_after:
            drafts = self.draft_model.propose_after(so.draft_after, req_ids, self.requests)
        cache = None if self.mm is None else self.mm.encoder_cache
        runs_before, hits_before = launched.encoder_counts
        now = time.perf_counter()
        output = ModelRunnerOutput(
            step_id=so.step_id,
            worker_id=self.worker_id,
            epoch=so.epoch,
            req_ids=req_ids,
            sampled_token_ids=[run[-1] for run in runs],
            finish_reasons=finish_reasons,
            req_errors=launched.req_errors,
            num_scheduled_tokens=int(batch.input_ids.shape[1]),
            accepted_draft_token_ids={
                i: run[:-1] for i, run in zip(req_ids, runs, strict=True) if len(run) > 1
            },
            draft_token_ids=drafts,
            num_encoder_runs=0 if cache is None else cache.num_encoder_runs - runs_before,
            num_encoder_cache_hits=0 if cache is None else cache.num_cache_hits - hits_before,
            # From its launch, or the end of the step it was launched behind (its wait on the device).
            step_time=now - max(launched.started, self._last_finished_at),
            overlapped=launched.overlapped,
        )
        self._last_finished_at = now
        states = {r.state.req_id: r.state for r in reqs}
        return FinishedStep(output, self._events(output, states, step.logprobs, firsts))

    def _events(
        self,
        output: ModelRunnerOutput,
        states: Mapping[str, CachedRequestState],
        logprobs: Mapping[str, list[SampleLogprobs]],
        firsts: Mapping[str, int],
    ) -> list[WorkerEvent]:
        """The token-stream events of a finished step (step/output.py)."""
        return list(token_events(output, states, logprobs, firsts))

    # ---- apply the diff -------------------------------------------------------------------------

    def _apply(self, so: SchedulerOutput, req_errors: dict[str, str]) -> None:
        for req_id in so.finished_req_ids:
            self._drop(req_id)  # already gone after a per-request error: nothing to do
        for new in so.scheduled_new_reqs:
            error = check_new(new, self.vocab_size, self.max_model_len, self.num_blocks)
            structured = new.sampling_params.structured_output
            if error is None and new.lora_request is not None:
                error = self._add_lora(new.lora_request)
            if error is None and new.mm_features:
                error = add_images(self.mm, new, self.model_name)
            if error is None and structured is not None:
                error = self.structured_outputs.add(
                    new.req_id, structured, new.output_token_ids, new.sampling_params.ignore_eos
                )
            self._fail_or(req_errors, new.req_id, error)
            if new.req_id not in req_errors:
                self.requests[new.req_id] = CachedRequestState.from_new(new)
                self.sampling_state.add(
                    new.req_id, new.sampling_params, new.prompt_token_ids, new.output_token_ids
                )
        for cached in so.scheduled_cached_reqs:
            error = check_cached(cached, self.requests.get(cached.req_id), self.num_blocks)
            self._fail_or(req_errors, cached.req_id, error)
            if cached.req_id not in req_errors:
                self.requests[cached.req_id].block_ids.extend(cached.new_block_ids)

    def _add_lora(self, lora: LoRARequest) -> str | None:
        """The adapter a new request names, read into host memory; why not, when it cannot be."""
        if self.lora is None:
            return f"LoRA adapter {lora.lora_name!r}: this worker serves no adapters (WORKER_ENABLE_LORA)"
        return self.lora.add(lora)

    def _fail_or(self, req_errors: dict[str, str], req_id: str, error: str | None) -> None:
        # A request that cannot run is dropped here alone; the batcher frees it on the reported error.
        if error is not None:
            req_errors[req_id] = error
            self._drop(req_id)

    def _drop(self, req_id: str) -> None:
        self.requests.pop(req_id, None)
        self.block_table.remove(req_id)
        self.sampling_state.remove(req_id)
        self.structured_outputs.remove(req_id)
        if self.mm is not None:
            self.mm.remove(req_id)
        if self.draft_model is not None:
            self.draft_model.free(req_id)

    def _scheduled(self, so: SchedulerOutput, req_errors: dict[str, str]) -> list[ScheduledRequest]:
        scheduled = []
        for req_id, num_tokens in so.num_scheduled_tokens.items():
            if req_id in req_errors:
                continue
            state = self.requests.get(req_id)
            if state is not None and state.finish_reason is not None:
                continue  # finished in an earlier step; the batcher frees it once it hears
            drafts = so.scheduled_spec_decode_tokens.get(req_id, [])
            error = check_scheduled(state, num_tokens, self.block_size, len(drafts))
            if error is not None or state is None:
                self._fail_or(req_errors, req_id, error or "unknown request")
                continue
            scheduled.append(ScheduledRequest(state=state, num_tokens=num_tokens, spec_token_ids=drafts))
        return scheduled

    # ---- forward, sample, advance ---------------------------------------------------------------

    def _forward(self, batch: InputBatch) -> torch.Tensor:
        """The step's logits (step/forward.py); called through self, so a benchmark can wrap it."""
        return forward_logits(batch, self.model, self.mm, self.decode_graphs, self.piecewise_graphs)

    @torch.inference_mode()
    def _forward_and_sample(self, batch: InputBatch) -> LaunchedSample:
        if not batch.scheduled:
            return LaunchedSample.read(SampledStep([], {}, {}, {}))
        return self._sample_step(batch)

    def _sample(self, batch: InputBatch) -> LaunchedSample:
        """Forward, grammar masks and sampling of a non-empty batch (step/sampling.py)."""
        kept = self._forward(batch)
        return launch_sample_step(batch, kept, self.sampler, self.sampling_state, self.structured_outputs)
