"""The step's forward: the CUDA graphs captured for it, and which way each batch runs (a replayed
decode graph, the piecewise graphs around eager attention, or the compiled forward itself)."""

from __future__ import annotations

from typing import Any

import torch

from gpu_worker.runner.attention.backend import AttentionBackend
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.graphs.capture import CudaGraphCapture
from gpu_worker.runner.graphs.decode import DecodeGraphs
from gpu_worker.runner.graphs.piecewise import PiecewiseGraphs
from gpu_worker.runner.input_batch import InputBatch
from gpu_worker.runner.load_model import Model
from gpu_worker.runner.multimodal.mm_step import MultiModalInputs
from gpu_worker.runner.sample.prompt_logprobs import collect_prompt_logprobs
from gpu_worker.settings import WorkerSettings


def capture_graphs(
    settings: WorkerSettings,
    model: Model,
    attn_backend: AttentionBackend[Any],
    *,
    max_num_seqs: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    device: torch.device,
) -> tuple[DecodeGraphs, PiecewiseGraphs | None]:
    """The decode graphs, and the piecewise graphs when `settings` ask for them, captured."""
    capture = CudaGraphCapture() if device.type == "cuda" else None  # one pool for all
    decode_graphs = DecodeGraphs(
        model,
        attn_backend,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        device=device,
        capture=capture,
    )
    decode_graphs.capture()
    # The other steps, around attention: our own decoder's layers split there.
    if not (settings.piecewise_cuda_graphs and isinstance(model, Decoder)):
        return decode_graphs, None
    piecewise_graphs = PiecewiseGraphs(
        model,
        attn_backend,
        max_num_batched_tokens=max_num_batched_tokens,
        device=device,
        capture=capture,
        # Inductor's fused pieces, as the forward is (the CPU tests run them eagerly).
        compile_backend="inductor" if settings.compile and capture is not None else None,
    )
    piecewise_graphs.capture()
    return decode_graphs, piecewise_graphs


def forward_logits(
    batch: InputBatch,
    model: Model,
    mm: MultiModalInputs | None,
    decode_graphs: DecodeGraphs | None,
    piecewise_graphs: PiecewiseGraphs | None,
) -> torch.Tensor:
    """Logits of the rows that sample [N, vocab], then of the drafts' rows (verify_greedy): a
    replayed graph for decode-only steps, graphs around eager attention for other small steps."""
    if decode_graphs is not None and decode_graphs.can_run(batch):
        return decode_graphs.run(batch)
    if piecewise_graphs is not None and piecewise_graphs.can_run(batch):
        logits = piecewise_graphs.run(batch)
    else:
        logits = forward_eager(batch, model, mm)
    if batch.prompt_rows:
        num_kept = batch.logits_indices.shape[0]
        if batch.spec_indices is not None:
            num_kept += batch.spec_indices.shape[0]
        assert batch.prompt_targets is not None
        collect_prompt_logprobs(logits[num_kept:], batch.prompt_targets, batch.prompt_rows)
        logits = logits[:num_kept]
    return logits


def forward_eager(batch: InputBatch, model: Model, mm: MultiModalInputs | None) -> torch.Tensor:
    """The compiled forward's logits of the kept rows (uncaptured)."""
    # Only the worker's decoder takes slots (WORKER_ENABLE_LORA refuses any other model).
    extra: dict[str, torch.Tensor] = {} if batch.lora_ids is None else {"lora_ids": batch.lora_ids}
    position_ids = batch.position_ids
    if mm is not None:  # images encoded (or found cached) and merged; M-RoPE positions
        extra["inputs_embeds"] = mm.inputs_embeds(batch)
        position_ids = mm.positions(batch)
    outputs = model(
        input_ids=batch.input_ids,
        position_ids=position_ids,
        use_cache=False,  # the paged pool is the cache; no DynamicCache
        logits_to_keep=batch.kept_indices,  # logits only where a token is sampled (or scored)
        attn_metadata=batch.attn_metadata,
        **extra,
    )
    logits: torch.Tensor = outputs.logits[0]
    return logits
