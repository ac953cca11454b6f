"""The pooling runner of a bidirectional encoder (BERT, RoBERTa, XLM-RoBERTa, ModernBERT...):
transformers' own model over a padded batch of the step's requests, no KV cache.

Every token attends to every other, so a prompt is computed whole in one step: the worker tells the
batcher so (`chunked_prefill` false), and the batcher sends each request once, whole, never from a
cached prefix. Its KV blocks are bookkeeping only: the pool it announces holds a full batch of the
longest prompts. An embedding pools the last hidden state as the sentence-transformers Pooling module
does (cls, mean over the attention mask, last token); a `*ForSequenceClassification` gives its logits.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Sequence

import torch
from transformers import AutoModel, AutoModelForSequenceClassification, PreTrainedModel

from common.protocol import (
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    WorkerEvent,
    WorkerInfo,
)
from gpu_worker.runner.pooling.model_files import PoolingSpec, encoder_max_len
from gpu_worker.runner.pooling.pooled_output import pooled_values, pooling_event
from gpu_worker.runner.runner_info import worker_info_of
from gpu_worker.runner.step.launched import FinishedStep, StepHandle
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)


class EncoderRunner:
    def __init__(self, settings: WorkerSettings, spec: PoolingSpec) -> None:
        if (
            settings.speculative_config is not None
            or settings.quantization is not None
            or settings.null_model
        ):
            raise ValueError(
                "an encoder runs transformers' own forward: unset WORKER_SPECULATIVE_CONFIG, "
                "WORKER_QUANTIZATION and WORKER_NULL_MODEL"
            )
        self.worker_id = settings.worker_id
        self.model_name = settings.model
        self.device = torch.device(settings.device)
        self.spec = spec
        self.model = _load(settings, spec)
        self.vocab_size = int(spec.config.vocab_size)
        self.pad_token_id = int(getattr(spec.config, "pad_token_id", None) or 0)
        self.block_size = settings.block_size
        self.max_num_seqs = settings.resolved_max_num_seqs
        self.max_num_batched_tokens = settings.resolved_max_num_batched_tokens
        limits = [encoder_max_len(spec.config), spec.max_seq_length, settings.max_model_len]
        self.max_model_len = min(limit for limit in limits if limit)
        # Bookkeeping only: room for a full batch of the longest prompts, so blocks never hold one back.
        self.num_blocks = self.max_num_seqs * -(-self.max_model_len // self.block_size)
        self.num_isolated_steps = 0
        self._token_types = "token_type_ids" in inspect.signature(self.model.forward).parameters
        self._done: dict[str, tuple[NewRequestData, torch.Tensor]] = {}  # until published

    def worker_info(self) -> WorkerInfo:
        return self.spec.worker_info(worker_info_of(self))

    def reset(self) -> None:
        self._done.clear()

    def launch(self, so: SchedulerOutput) -> StepHandle:
        """An encoder's step is finished when it returns."""
        output = self.execute_model(so)
        return StepHandle.finished(FinishedStep(output, self.token_events(output)))

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        started = time.perf_counter()
        errors = {
            c.req_id: "an encoder computes a prompt whole: it was sent in parts"
            for c in so.scheduled_cached_reqs
        }
        ready: list[NewRequestData] = []
        for new in so.scheduled_new_reqs:
            error = self._check(new, so.num_scheduled_tokens.get(new.req_id, 0))
            if error is None:
                ready.append(new)
            else:
                errors[new.req_id] = error
        try:
            done = self._run(ready)
        except Exception:
            logger.exception("step %d failed: rerunning it request by request", so.step_id)
            self.num_isolated_steps += 1
            done = {}
            for new in ready:
                try:
                    done.update(self._run([new]))
                except Exception as exc:
                    errors[new.req_id] = f"{type(exc).__name__}: {exc}"
        by_id = {new.req_id: new for new in ready}
        for req_id, values in done.items():
            self._done[req_id] = (by_id[req_id], values)
        req_ids = list(done)
        return ModelRunnerOutput(
            step_id=so.step_id,
            worker_id=self.worker_id,
            epoch=so.epoch,
            req_ids=req_ids,
            sampled_token_ids=[0] * len(req_ids),  # a placeholder that only ends the request
            finish_reasons=["length"] * len(req_ids),
            req_errors=errors,
            num_scheduled_tokens=sum(len(by_id[i].prompt_token_ids) for i in req_ids),
            step_time=time.perf_counter() - started,
        )

    def token_events(self, output: ModelRunnerOutput) -> Sequence[WorkerEvent]:
        events: list[WorkerEvent] = []
        for req_id in output.req_ids:
            new, values = self._done.pop(req_id)
            events.append(pooling_event(req_id, new.attempt, values, len(new.prompt_token_ids), 0))
        return events

    def _check(self, new: NewRequestData, num_scheduled: int) -> str | None:
        prompt = new.prompt_token_ids
        params = self.spec.params_of(new.pooling_params)
        if params.task not in self.spec.tasks:
            return f"the model serves {', '.join(self.spec.tasks)}, not {params.task}"
        if not prompt or num_scheduled != len(prompt) or new.num_computed_tokens:
            return "an encoder computes a prompt whole, in one step"
        if len(prompt) > self.max_model_len:
            return f"{len(prompt)} tokens exceed max_model_len {self.max_model_len}"
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            return f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})"
        if new.token_type_ids is not None and len(new.token_type_ids) != len(prompt):
            return f"{len(new.token_type_ids)} token_type_ids for {len(prompt)} prompt tokens"
        return None

    @torch.inference_mode()
    def _run(self, requests: list[NewRequestData]) -> dict[str, torch.Tensor]:
        """Each request's values, computed in padded batches of similar lengths, each batch at most
        `max_num_batched_tokens` tokens with its padding (at least one request)."""
        done: dict[str, torch.Tensor] = {}
        ordered = sorted(requests, key=lambda r: len(r.prompt_token_ids))
        while ordered:
            batch = [ordered.pop()]  # the longest left sets the width
            width = len(batch[0].prompt_token_ids)
            while ordered and (len(batch) + 1) * width <= self.max_num_batched_tokens:
                batch.append(ordered.pop())
            for new, raw in zip(batch, self._forward(batch, width), strict=True):
                done[new.req_id] = pooled_values(raw, self.spec.params_of(new.pooling_params), self.spec)
        return done

    def _forward(self, batch: list[NewRequestData], width: int) -> torch.Tensor:
        """[B, D]: each request's pooled hidden state, or its classifier logits."""
        lengths = torch.tensor([len(r.prompt_token_ids) for r in batch])
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        types = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, : len(r.prompt_token_ids)] = torch.tensor(r.prompt_token_ids)
            if r.token_type_ids is not None:
                types[i, : len(r.token_type_ids)] = torch.tensor(r.token_type_ids)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        inputs = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}
        if self._token_types:
            inputs["token_type_ids"] = types.to(self.device)
        out = self.model(**inputs)
        if self.spec.classifier:
            return out.logits
        hidden = out.last_hidden_state
        if self.spec.pooling_type == "cls":
            return hidden[:, 0]
        if self.spec.pooling_type == "last":
            return hidden[torch.arange(len(batch)), (lengths - 1).to(self.device)]
        weights = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1, dtype=torch.float32) / lengths.to(self.device, torch.float32)[
            :, None
        ]


def _load(settings: WorkerSettings, spec: PoolingSpec) -> PreTrainedModel:
    auto = AutoModelForSequenceClassification if spec.classifier else AutoModel
    logger.info("loading the weights of %s", settings.model)
    model = auto.from_pretrained(spec.model_dir, dtype=getattr(torch, settings.resolved_dtype))
    model.to(torch.device(settings.device))
    model.eval()
    return model
