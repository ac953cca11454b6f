"""Drafts from a small model with the target's tokenizer (SPECULATIVE_CONFIG method "draft_model"),
run by the worker over its own paged KV pool.

After a step, the requests the batcher asked drafts for get the draft model's greedy continuation,
all of them in one forward per draft position (vLLM's draft-model proposer batches the same way).
The first forward is ragged: it feeds each request the tokens its draft KV lacks (accepted drafts
are there already, rejected ones are cut off). The later positions run on the device
(draft_loop.py): each feeds every request the draft just made, without a readback, in static
buffers that CUDA graphs capture, one graph for all of them per padded batch size (with the triton
backend, where the worker's settings capture the decode steps). All drafts come back in one copy
at the end. A request asking fewer drafts than the batch's most runs along, writing nothing that
is read, and its extra drafts are dropped here. The batcher sends the drafts with its next step,
where they are verified like any draft (verify.py); greedy drafts are point masses, so
verification keeps the target's distribution at any temperature.

The pool has as many blocks as the target's (the worker splits its KV budget between the two), one
spare block no request holds (where the later positions' idle rows write), and its own free list:
a request holds at most a block more than in the target's pool, and one that finds no free block
gets no drafts that step, never an error. A request that comes back after preemption or from
another worker starts again from its tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch
from transformers import AutoConfig

from common.protocol import SamplingParams
from gpu_worker.runner.attention.selector import make_attention_backend
from gpu_worker.runner.block_table import BlockTable
from gpu_worker.runner.cached_request_state import CachedRequestState
from gpu_worker.runner.graphs.capture import CudaGraphCapture
from gpu_worker.runner.host_copies import DeviceToHost, PinnedRing
from gpu_worker.runner.input_batch import InputBatch, ScheduledRequest, build_input_batch
from gpu_worker.runner.load_model import KVShape, allocate_kv_cache, kv_shape, load_model, model_max_len
from gpu_worker.runner.spec_decode.draft_loop import DraftDecodeLoop
from gpu_worker.runner.step_input_buffers import StepInputBuffers
from gpu_worker.settings import WorkerSettings

logger = logging.getLogger(__name__)

# What a draft request's state carries for build_input_batch; drafts are always the argmax.
_GREEDY = SamplingParams(temperature=0.0)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModelProposer:
    def __init__(self, settings: WorkerSettings, model_dir: str, target_vocab_size: int) -> None:
        config = AutoConfig.from_pretrained(model_dir)
        draft_vocab = int(config.get_text_config().vocab_size)
        if draft_vocab > target_vocab_size:
            raise ValueError(
                f"the draft model {model_dir} has {draft_vocab} tokens, more than the target's "
                f"{target_vocab_size}: it needs the target's tokenizer"
            )
        # The target's device, dtype and compilation; never quantized (a draft only has to agree).
        self.model = load_model(settings.model_copy(update={"model": model_dir, "quantization": None}))
        self.kv_shape: KVShape = kv_shape(config)
        self.device = torch.device(settings.device)
        self.block_size = settings.block_size
        self.max_len = model_max_len(config) or 0
        self._backend_name = settings.resolved_attention_backend
        # The later positions in padded static buffers, captured as graphs on CUDA (draft_loop.py),
        # as the target's decode steps are: with the triton backend, where the settings ask for it.
        self._graphs = settings.resolved_cuda_graphs and self._backend_name == "triton"
        self._max_num_seqs = settings.resolved_max_num_seqs
        spec = settings.speculative_config
        self._num_graph_positions = spec.num_draft_tokens - 1 if spec is not None else 0
        self._group_decodes = settings.resolved_group_decodes
        self._kv_cache_dtype: torch.dtype = getattr(torch, settings.resolved_kv_cache_dtype)
        self.requests: dict[str, CachedRequestState] = {}
        self.block_table = BlockTable()
        blocks = -(-self.max_len // self.block_size) if self.max_len else 1
        self._copies = DeviceToHost(self.device)  # the drafts, read back through pinned memory
        # The later positions' inputs, staged in pinned memory: a buffer is written again two
        # proposals later, when the readback between has waited for its copy.
        self._uploads = PinnedRing(torch.long, self.device)
        self.step_inputs = StepInputBuffers(
            settings.resolved_max_num_seqs, settings.resolved_max_num_batched_tokens, blocks, self.device
        )
        self.free_blocks: list[int] = []
        self.num_blocks = 0
        logger.info("draft model %s loaded (%d tokens)", model_dir, draft_vocab)

    def use_kv_cache(self, num_blocks: int) -> None:
        """Allocate the pool (`num_blocks` of the target's block size, and the spare one) and run
        one proposal, which compiles the forward before any request waits on it; then capture the
        later positions' graphs, which keep the pool's addresses."""
        # One block more than requests take: where the later positions' rows with nothing to write
        # write (draft_loop.py).
        self.kv_cache = allocate_kv_cache(
            self.kv_shape, num_blocks + 1, self.block_size, self._kv_cache_dtype, self.device
        )
        self.attn_backend = make_attention_backend(
            self._backend_name, self.kv_cache, self._group_decodes, dtype=self.model.dtype
        )
        self.num_blocks = num_blocks
        self.clear()
        # A request holds no more blocks than the pool has, nor than the draft's context takes.
        max_blocks = min(num_blocks, -(-self.max_len // self.block_size) or num_blocks)
        self.loop = DraftDecodeLoop(
            self.model,
            self.attn_backend,
            max_num_seqs=self._max_num_seqs,
            max_model_len=max_blocks * self.block_size,
            num_graph_positions=self._num_graph_positions,
            spare_slot=num_blocks * self.block_size,
            device=self.device,
            padded=self._graphs,
            capture=CudaGraphCapture() if self._graphs and self.device.type == "cuda" else None,
        )
        self.propose({"warm-up": ([0, 0], 2)})
        self.clear()
        self.loop.capture()

    @torch.inference_mode()
    def propose(self, asks: dict[str, tuple[list[int], int]]) -> dict[str, list[int]]:
        """req_id -> (its known tokens, k): the draft model's greedy tokens after them, at most k
        (fewer where its context ends; none for a request the pool has no room for)."""
        wanted: dict[str, int] = {}
        step: list[ScheduledRequest] = []
        for req_id, (token_ids, k) in asks.items():
            if self.max_len:
                k = min(k, self.max_len - len(token_ids))
            if k <= 0 or not token_ids:
                continue
            state = self._catch_up(req_id, token_ids, k)
            if state is None:
                continue
            wanted[req_id] = k
            step.append(ScheduledRequest(state, state.num_tokens - state.num_computed_tokens))
        if not step:
            return {}
        batch = build_input_batch(
            step, self.attn_backend, self.device, self.block_table, buffers=self.step_inputs
        )
        first = self._logits(batch).max(dim=-1).indices  # every row samples: its last token is fed
        states = [scheduled.state for scheduled in batch.sampling_reqs]
        ks = [wanted[state.req_id] for state in states]
        drafts = first.unsqueeze(1)
        if max(ks) > 1:
            n = len(states)
            lens = np.asarray([state.num_tokens for state in states], dtype=np.int64)
            last = lens + np.asarray(ks, dtype=np.int64) - 2  # a row's last draft is never fed
            rows = self.block_table.sync(states)
            tables = self.block_table.gather(rows, [len(state.block_ids) for state in states])
            # One non-blocking copy from pinned memory; the host waits for nothing here.
            inputs = self._uploads.to_device(np.concatenate([lens, last, tables.ravel()]))
            first_positions, last_positions, flat_tables = inputs.split([n, n, tables.size])
            block_tables = flat_tables.view(n, tables.shape[1])
            drafts = self.loop.run(first, first_positions, last_positions, block_tables, max(ks) - 1)
        width = drafts.shape[1]
        flat = self._copies.start(drafts.reshape(-1)).tolist()  # the one wait of the proposal
        made: dict[str, list[int]] = {}
        for i, (state, k) in enumerate(zip(states, ks, strict=True)):
            made[state.req_id] = flat[i * width : i * width + k]
            state.token_ids.extend(made[state.req_id][:-1])  # the drafts whose KV the loop wrote
            state.num_computed_tokens = state.num_tokens
        return {req_id: made[req_id] for req_id in wanted}

    def propose_after(
        self, draft_after: dict[str, int], req_ids: list[str], requests: Mapping[str, CachedRequestState]
    ) -> dict[str, list[int]]:
        """The drafts for the next step of each request that sampled (`req_ids`) and asked for them."""
        asks: dict[str, tuple[list[int], int]] = {}
        for req_id in req_ids:
            state = requests[req_id]
            k = draft_after.get(req_id, 0)
            if k > 0 and state.finish_reason is None:
                asks[req_id] = (state.token_ids, k)
        try:
            return self.propose(asks)
        except Exception:
            # Their tokens are sampled already: the requests go on without drafts, never fail.
            logger.exception("draft model failed on %d requests; no drafts for their next step", len(asks))
            for req_id in asks:
                self.free(req_id)
            return {}

    def _catch_up(self, req_id: str, token_ids: list[int], k: int) -> CachedRequestState | None:
        """`req_id`'s state holding `token_ids`, its KV kept up to where it agrees with them (the
        last token always fed: its logits give the first draft), with blocks for the k - 1 drafts
        whose KV the later forwards write; None when the pool has no room."""
        state = self.requests.get(req_id)
        if state is None:
            state = CachedRequestState(
                req_id=req_id,
                token_ids=[],
                num_prompt_tokens=0,
                sampling_params=_GREEDY,
                block_ids=[],
                num_computed_tokens=0,
                attempt=0,
            )
            self.requests[req_id] = state
        keep = min(_common_prefix(state.token_ids, token_ids), state.num_computed_tokens, len(token_ids) - 1)
        state.token_ids = list(token_ids)
        state.num_computed_tokens = keep
        needed = -(-(len(token_ids) + k - 1) // self.block_size) - len(state.block_ids)
        if needed > len(self.free_blocks):
            self.free(req_id)
            return None
        for _ in range(needed):
            state.block_ids.append(self.free_blocks.pop())
        return state

    def _logits(self, batch: InputBatch) -> torch.Tensor:
        """The catch-up forward: the logits [B, vocab] of each request's last known token."""
        logits: torch.Tensor = self.model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            use_cache=False,
            logits_to_keep=batch.logits_indices,
            attn_metadata=batch.attn_metadata,
        ).logits[0]
        return logits

    def free(self, req_id: str) -> None:
        state = self.requests.pop(req_id, None)
        self.block_table.remove(req_id)
        if state is not None:
            self.free_blocks.extend(state.block_ids)

    def clear(self) -> None:
        self.requests.clear()
        self.block_table.clear()
        self.free_blocks = list(range(self.num_blocks - 1, -1, -1))
