"""ModelRunner: applies a SchedulerOutput, runs one forward over the ragged batch, samples.

It keeps per-request state between steps (token ids, block table, computed count), so the batcher
only sends diffs. A step is all or nothing: if it raises, the new requests and block-table extensions
it brought are undone (its frees stay done) and it is rerun one request at a time, so a poison request
fails alone (in `req_errors`) while the rest of the batch gets its tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from common.lora.lora_adapter import BaseModelShapes
from common.protocol import (
    FinishReason,
    LoRARequest,
    ModelRunnerOutput,
    SchedulerOutput,
    WorkerEvent,
    WorkerInfo,
)
from gpu_worker.runner.attention.selector import make_attention_backend
from gpu_worker.runner.block_table import BlockTable
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.cuda_graphs import DecodeGraphs
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.graph_capture import CudaGraphCapture
from gpu_worker.runner.input_batch import InputBatch, ScheduledRequest, build_input_batch
from gpu_worker.runner.load_model import (
    Model,
    allocate_kv_cache,
    eos_token_ids,
    kv_shape,
    load_model,
    model_max_len,
    resolve_max_model_len,
    resolve_num_blocks,
)
from gpu_worker.runner.lora.manager import LoRAManager
from gpu_worker.runner.multimodal.mm_step import MultiModalInputs, add_images
from gpu_worker.runner.multimodal.vision_model import VisionLanguageModel
from gpu_worker.runner.piecewise_graphs import PiecewiseGraphs
from gpu_worker.runner.profile import (
    MemorySnapshot,
    ProfileStep,
    build_profile_step,
    kv_cache_budget,
    run_profile_step,
)
from gpu_worker.runner.runner_info import worker_info_of
from gpu_worker.runner.sample.logprobs import SampleLogprobs
from gpu_worker.runner.sample.prompt_logprobs import collect_prompt_logprobs
from gpu_worker.runner.sample.sampler import Sampler
from gpu_worker.runner.sample.sampling_state import SamplingState
from gpu_worker.runner.spec_decode.draft_model import DraftModelProposer
from gpu_worker.runner.spec_decode.verify import accept_drafts, run_logprobs, sample_drafts
from gpu_worker.runner.step_checks import check_cached, check_new, check_scheduled
from gpu_worker.runner.step_hooks import with_step_hooks
from gpu_worker.runner.step_input_buffers import StepInputBuffers
from gpu_worker.runner.step_output import advance, token_events
from gpu_worker.runner.structured_output.matchers import StructuredOutputs
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)


class _StepFailed(Exception):
    """A step raised; its diff has been rolled back."""


class ModelRunner:
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
        self._use_kv_cache(self.num_blocks)
        self.vocab_size = int(config.get_text_config().vocab_size)
        self.eos_token_ids = eos_token_ids(self.model)
        self.sampler = Sampler(settings.seed, self.device)
        # Sampling parameters and penalty counts of every held request, kept on the device.
        self.sampling_state = SamplingState(self.vocab_size, self.device, self.eos_token_ids)
        # Grammar matchers of the requests with structured outputs (tokenizer loaded on first use).
        self.structured_outputs = StructuredOutputs(
            settings.model, self.vocab_size, self.eos_token_ids, self.device
        )
        # What the last step's grammars ended, by req_id, for advance().
        self._grammar_ends: dict[str, FinishReason] = {}
        # The drafts the last step accepted, by req_id (only requests that drafted).
        self._step_accepted: dict[str, list[int]] = {}
        spec = settings.speculative_config
        self.draft_model: DraftModelProposer | None = None
        if spec is not None and spec.model is not None:
            self.draft_model = DraftModelProposer(settings, spec.model, self.vocab_size)
        # The real forward and sampling, or a test/benchmark stand-in chosen once (step_hooks.py).
        self._sample_step = with_step_hooks(settings, self._sample)
        self.requests: dict[str, CachedRequestState] = {}
        # The adapters in host memory and in the decoder's slots (WORKER_ENABLE_LORA); None without.
        self.lora = self._lora_manager(settings)
        self.block_table = BlockTable(self.max_num_seqs, -(-self.max_model_len // self.block_size))
        # The step's input tensors, written in place each step (step_input_buffers.py).
        self.step_inputs = StepInputBuffers(
            self.max_num_seqs, self.max_num_batched_tokens, self.block_table.table.shape[1], self.device
        )
        # Logprobs of the last step's samples, by req_id, for its token events (only requests that asked).
        self._step_logprobs: dict[str, list[SampleLogprobs]] = {}  # per token of each run
        self.num_isolated_steps = 0  # steps that raised and were rerun request by request
        self.decode_graphs: DecodeGraphs | None = None  # none during the profiling step
        self.piecewise_graphs: PiecewiseGraphs | None = None
        self._size_kv_cache(settings, profile, memory_at_start)
        # Captured last, over the real pool: graphs hold the addresses of the pool and the weights.
        # A vision-language model's steps take embeddings, which the decode graphs do not.
        if settings.resolved_cuda_graphs and not settings.null_model and self.mm is None:
            capture = CudaGraphCapture() if self.device.type == "cuda" else None  # one pool for all
            self.decode_graphs = DecodeGraphs(
                self.model,
                self.attn_backend,
                max_num_seqs=self.max_num_seqs,
                max_model_len=self.max_model_len,
                device=self.device,
                capture=capture,
            )
            self.decode_graphs.capture()
            # The other steps, around attention: our own decoder's layers split there.
            if settings.piecewise_cuda_graphs and isinstance(self.model, Decoder):
                self.piecewise_graphs = PiecewiseGraphs(
                    self.model,
                    self.attn_backend,
                    max_num_batched_tokens=self.max_num_batched_tokens,
                    device=self.device,
                    capture=capture,
                    # Inductor's fused pieces, as the forward is (the CPU tests run them eagerly).
                    compile_backend="inductor" if settings.compile and capture is not None else None,
                )
                self.piecewise_graphs.capture()

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

    def _use_kv_cache(self, num_blocks: int) -> None:
        """Allocate a pool of `num_blocks` and the attention backend that reads it."""
        self.kv_cache = allocate_kv_cache(
            kv_shape(self.model.config), num_blocks, self.block_size, self._kv_cache_dtype, self.device
        )
        self.attn_backend = make_attention_backend(
            self._attention_backend_name,
            self.kv_cache,
            self._group_decodes,
            self._cascade_attention,
            self.model.dtype,
        )
        # The backend of steps whose queries see past themselves (key limits): the torch one reads them.
        self.mask_backend = self.attn_backend
        if self.attn_backend.name != "torch":
            self.mask_backend = make_attention_backend(
                "torch", self.kv_cache, self._group_decodes, False, self.model.dtype
            )

    def _size_kv_cache(
        self, settings: WorkerSettings, step: ProfileStep, start: MemorySnapshot | None
    ) -> None:
        """Run the profiling step in the temporary pool, then give the real pool what it leaves."""
        result = run_profile_step(self, step)
        del self.kv_cache, self.attn_backend, self.mask_backend  # freed before measuring what is left
        budget = kv_cache_budget(settings, self.device, start, result)
        shapes = [kv_shape(self.model.config)]
        if self.draft_model is not None:
            shapes.append(self.draft_model.kv_shape)  # a block of each pool per block of the budget
        self.num_blocks = resolve_num_blocks(settings, shapes, self._kv_cache_dtype, budget)
        self.max_model_len = resolve_max_model_len(settings, self.model.config, self.num_blocks)
        self._use_kv_cache(self.num_blocks)
        if self.draft_model is not None:
            self.draft_model.use_kv_cache(self.num_blocks)

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

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        started = time.perf_counter()
        try:
            output = self._execute(scheduler_output)
        except _StepFailed as failed:
            # Rare path: find the culprit instead of failing the whole batch (see _isolate).
            logger.warning("step %d: rerunning it request by request (%s)", scheduler_output.step_id, failed)
            self.num_isolated_steps += 1
            output = self._isolate(scheduler_output)
        output.step_time = time.perf_counter() - started
        return output

    def reset(self) -> None:
        """Forget every request (the batcher has moved them elsewhere); the pool is simply reused."""
        self.requests.clear()
        self.block_table.clear()
        self.sampling_state.clear()
        self.structured_outputs.clear()
        if self.mm is not None:
            self.mm.clear()
        if self.draft_model is not None:
            self.draft_model.clear()

    def _execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step, all or nothing: on an exception its diff is rolled back and _StepFailed raised."""
        req_errors: dict[str, str] = {}
        undo = self._undo_log(scheduler_output)
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
                self._lora_slots(scheduled),
                image_runs,
                self.step_inputs,
            )
            sampled = self._forward_and_sample(batch)
        except Exception as exc:
            logger.exception("step %d failed", scheduler_output.step_id)
            self._rollback(undo)
            raise _StepFailed(f"{type(exc).__name__}: {exc}") from exc
        req_ids = [r.state.req_id for r in batch.sampling_reqs]
        runs = [[*self._step_accepted.get(i, []), t] for i, t in zip(req_ids, sampled, strict=True)]
        finish_reasons = advance(batch, runs, self.eos_token_ids, self.max_model_len, self._grammar_ends)
        drafts = self._propose_drafts(scheduler_output.draft_after, req_ids)
        return ModelRunnerOutput(
            step_id=scheduler_output.step_id,
            worker_id=self.worker_id,
            req_ids=req_ids,
            sampled_token_ids=[run[-1] for run in runs],
            finish_reasons=finish_reasons,
            req_errors=req_errors,
            num_scheduled_tokens=int(batch.input_ids.shape[1]),
            accepted_draft_token_ids={
                i: run[:-1] for i, run in zip(req_ids, runs, strict=True) if len(run) > 1
            },
            draft_token_ids=drafts,
            num_encoder_runs=0 if cache is None else cache.num_encoder_runs - encoder_counts[0],
            num_encoder_cache_hits=0 if cache is None else cache.num_cache_hits - encoder_counts[1],
        )

    def _propose_drafts(self, draft_after: dict[str, int], req_ids: list[str]) -> dict[str, list[int]]:
        """The draft model's drafts for the next step of each request that sampled and asked for them."""
        if self.draft_model is None or not draft_after:
            return {}
        asks: dict[str, tuple[list[int], int]] = {}
        for req_id in req_ids:
            state = self.requests[req_id]
            k = draft_after.get(req_id, 0)
            if k > 0 and state.finish_reason is None:
                asks[req_id] = (state.token_ids, k)
        try:
            return self.draft_model.propose(asks)
        except Exception:
            # Their tokens are sampled already: the requests go on without drafts, never fail.
            logger.exception("draft model failed on %d requests; no drafts for their next step", len(asks))
            for req_id in asks:
                self.draft_model.free(req_id)
            return {}

    def _isolate(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Rerun a failed step one request at a time: the ones that fail alone are reported in
        `req_errors` (and dropped here), the others get their token as if the step had not failed.

        Only the failure path pays for this (one forward per request, once); the happy path is one
        forward as before. A failed forward may have written K/V of this step's slots, which the
        rerun overwrites with the same values, so the survivors' tokens are unchanged.
        """
        merged = ModelRunnerOutput(
            step_id=so.step_id, worker_id=self.worker_id, req_ids=[], sampled_token_ids=[], finish_reasons=[]
        )
        frees = so.finished_req_ids
        logprobs: dict[str, list[SampleLogprobs]] = {}  # each rerun's forward resets _step_logprobs
        for req_id, num_tokens in so.num_scheduled_tokens.items():
            alone = SchedulerOutput(
                step_id=so.step_id,
                scheduled_new_reqs=[n for n in so.scheduled_new_reqs if n.req_id == req_id],
                scheduled_cached_reqs=[c for c in so.scheduled_cached_reqs if c.req_id == req_id],
                num_scheduled_tokens={req_id: num_tokens},
                total_num_scheduled_tokens=num_tokens,
                finished_req_ids=frees,
                scheduled_spec_decode_tokens={
                    i: d for i, d in so.scheduled_spec_decode_tokens.items() if i == req_id
                },
                draft_after={i: k for i, k in so.draft_after.items() if i == req_id},
            )
            frees = []  # applied with the first request
            try:
                out = self._execute(alone)
            except _StepFailed as failed:
                self._drop(req_id)  # the batcher recomputes it from scratch if it retries
                merged.req_errors[req_id] = str(failed)
                continue
            logprobs.update(self._step_logprobs)
            merged.req_ids += out.req_ids
            merged.sampled_token_ids += out.sampled_token_ids
            merged.finish_reasons += out.finish_reasons
            merged.req_errors.update(out.req_errors)
            merged.accepted_draft_token_ids.update(out.accepted_draft_token_ids)
            merged.draft_token_ids.update(out.draft_token_ids)
            merged.num_scheduled_tokens += out.num_scheduled_tokens
            merged.num_encoder_runs += out.num_encoder_runs
            merged.num_encoder_cache_hits += out.num_encoder_cache_hits
        self._step_logprobs = logprobs
        return merged

    def token_events(self, output: ModelRunnerOutput) -> Sequence[WorkerEvent]:
        """The token-stream events of a step result; valid until the next step frees finished requests."""
        return token_events(output, self.requests, self._step_logprobs)

    # ---- apply the diff -------------------------------------------------------------------------

    def _undo_log(self, so: SchedulerOutput) -> dict[str, int | None]:
        """How to undo the diff: new requests (None) are removed, block tables cut back to a length."""
        undo: dict[str, int | None] = {new.req_id: None for new in so.scheduled_new_reqs}
        for cached in so.scheduled_cached_reqs:
            state = self.requests.get(cached.req_id)
            if state is not None:
                undo[cached.req_id] = len(state.block_ids)
        return undo

    def _rollback(self, undo: dict[str, int | None]) -> None:
        for req_id, num_blocks in undo.items():
            state = self.requests.get(req_id)
            if num_blocks is None:
                self._drop(req_id)
            elif state is not None:
                del state.block_ids[num_blocks:]
                self.block_table.truncate(req_id, num_blocks)

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

    def _lora_slots(self, scheduled: list[ScheduledRequest]) -> dict[str, int] | None:
        """The slot of each scheduled request that runs an adapter, the step's adapters copied into
        the decoder's slots first; None on a worker without LoRA."""
        if self.lora is None:
            return None
        loras = [r.state.lora_request for r in scheduled if r.state.lora_request is not None]
        slots = self.lora.slots_for(loras)
        return {
            r.state.req_id: slots[r.state.lora_request.cache_key]
            for r in scheduled
            if r.state.lora_request is not None
        }

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
        """Logits of the rows that sample [N, vocab], then of the drafts' rows (verify_greedy): a
        replayed graph for decode-only steps, graphs around eager attention for other small steps."""
        if self.decode_graphs is not None and self.decode_graphs.can_run(batch):
            return self.decode_graphs.run(batch)
        if self.piecewise_graphs is not None and self.piecewise_graphs.can_run(batch):
            logits = self.piecewise_graphs.run(batch)
        else:
            logits = self._forward_eager(batch)
        if batch.prompt_rows:
            num_kept = batch.logits_indices.shape[0]
            if batch.spec_indices is not None:
                num_kept += batch.spec_indices.shape[0]
            assert batch.prompt_targets is not None
            collect_prompt_logprobs(logits[num_kept:], batch.prompt_targets, batch.prompt_rows)
            logits = logits[:num_kept]
        return logits

    def _forward_eager(self, batch: InputBatch) -> torch.Tensor:
        """The compiled forward's logits of the kept rows (uncaptured)."""
        # Only the worker's decoder takes slots (WORKER_ENABLE_LORA refuses any other model).
        extra: dict[str, torch.Tensor] = {} if batch.lora_ids is None else {"lora_ids": batch.lora_ids}
        position_ids = batch.position_ids
        if self.mm is not None:  # images encoded (or found cached) and merged; M-RoPE positions
            extra["inputs_embeds"] = self.mm.inputs_embeds(batch)
            position_ids = self.mm.positions(batch)
        outputs = self.model(
            input_ids=batch.input_ids,
            position_ids=position_ids,
            use_cache=False,  # the paged pool is the cache; no DynamicCache
            logits_to_keep=batch.kept_indices,  # logits only where a token is sampled (or scored)
            attn_metadata=batch.attn_metadata,
            **extra,
        )
        logits: torch.Tensor = outputs.logits[0]
        return logits

    @torch.inference_mode()
    def _forward_and_sample(self, batch: InputBatch) -> list[int]:
        self._step_logprobs = {}
        self._grammar_ends = {}
        self._step_accepted = {}
        if not batch.scheduled:
            return []
        return self._sample_step(batch)

    def _sample(self, batch: InputBatch) -> list[int]:
        """Forward, grammar masks and sampling of a non-empty batch; the logprobs kept for its events."""
        kept = self._forward(batch)
        num_sampling = len(batch.sampling_reqs)
        logits = kept[:num_sampling]
        req_ids = [r.state.req_id for r in batch.sampling_reqs]
        spec = [(r.state.req_id, r.spec_token_ids) for r in batch.spec_reqs]
        grammar, draft_grammar = self.structured_outputs.masks(req_ids, spec)
        # Before `sample`, which records the step's tokens in the sampling state.
        drafted = sample_drafts(self.sampler, self.sampling_state, batch, kept[num_sampling:], draft_grammar)
        # A drafting request's sampling row comes after its drafts.
        earlier = [r.spec_token_ids for r in batch.sampling_reqs] if batch.spec_reqs else None
        result = self.sampler.sample(logits, self.sampling_state, req_ids, grammar, earlier)
        tokens = self._verify_drafts(batch, drafted.token_ids, result.token_ids)
        self._step_logprobs = run_logprobs(batch, self._step_accepted, result.logprobs, drafted.logprobs)
        runs = [[*self._step_accepted.get(i, []), t] for i, t in zip(req_ids, tokens, strict=True)]
        self._grammar_ends = self.structured_outputs.accept(req_ids, runs)
        for req_id in self._grammar_ends:  # its run may end at a stop token among its drafts
            i = req_ids.index(req_id)
            tokens[i] = runs[i][-1]
            if req_id in self._step_accepted:
                self._step_accepted[req_id] = runs[i][:-1]
        return tokens

    def _verify_drafts(self, batch: InputBatch, draft_samples: list[int], sampled: list[int]) -> list[int]:
        """The step's tokens with each drafting request's replaced by the last of its verified run;
        the drafts it accepted kept in `_step_accepted`."""
        if not batch.spec_reqs:
            return sampled
        tokens = list(sampled)
        row = {r.state.req_id: i for i, r in enumerate(batch.sampling_reqs)}
        spec_ids = [r.state.req_id for r in batch.spec_reqs]
        drafts = [r.spec_token_ids for r in batch.spec_reqs]
        runs = accept_drafts(drafts, draft_samples, [tokens[row[i]] for i in spec_ids])
        for req_id, run in zip(spec_ids, runs, strict=True):
            self.sampling_state.count_run(req_id, run[:-1], tokens[row[req_id]], run[-1])
            tokens[row[req_id]] = run[-1]
            self._step_accepted[req_id] = run[:-1]
        return tokens
