"""Piecewise CUDA graphs for the steps decode graphs cannot take (prefill chunks mixed with decodes,
drafts, prompt logprobs): everything but attention captured per token-count bucket, attention run
eagerly between the pieces (vLLM's `CUDAGraphMode.PIECEWISE`, split at module level here, not in an
FX graph).

A step of T tokens is padded to the smallest bucket that holds it. Its pieces, each captured once per
bucket and replayed from static buffers sized for the largest bucket:

- embeddings, RoPE's cos/sin and layer 0's `pre_attention` (norm, q/k/v, q/k norms, RoPE);
- per layer i: attention eagerly over the real rows only (views [:T] of the static q/k/v, the step's
  own metadata, output copied into the static attention buffer), then a piece of layer i's
  `post_attention` (o_proj, residual, norm, MLP) and layer i+1's `pre_attention`;
- the last `post_attention` and the final norm; then, eagerly, lm_head over the kept rows only.

Every op of a piece works row by row (norms, GEMMs, RoPE, per-token activation scales, LoRA deltas by
each row's slot), so padding rows T..bucket never mix with real rows and need no mask: they compute
garbage from stale buffers, in their own rows, which attention never reads (it sees [:T]) and the kept
rows never select. lm_head stays out of the graphs because the kept rows vary apart from T (a
sampling row per request, plus drafts and prompt rows): captured, it would run over every padded row
(a [bucket, vocab] GEMM), as vLLM also keeps `compute_logits` out of its graphs.

Attention runs eagerly, so any backend works; the runner builds these only where it captures decode
graphs (the triton backend), for a text decoder of our own, when WORKER_PIECEWISE_CUDA_GRAPHS asks:
decode-only steps still replay their full graph (decode.py), and steps past the largest bucket
run the compiled forward. The compiled forward is one graph with attention inside, so the pieces are
compiled apart (`compile_backend`, inductor on a GPU with WORKER_COMPILE): each is a function of the
modules it runs, so one graph serves every layer, the layers' weights its inputs. Uncompiled, a replay
would save every launch but run the norms, RoPE and SiLU unfused. The setting is off until a GPU
measures it (docs/benchmarks.md, *GPU predictions*).

Without capture (`capture=None`, the CPU) the same padded pieces run eagerly: that is how the CPU
tests check the padding. A bucket whose capture fails runs eagerly the same way, with one warning.
What a piece runs makes no host tensor and waits for nothing: the capture-rules lane
(tests/unit/gpu_worker/test_capture_rules.py) checks that on the CPU with fake `cuda` tensors.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from gpu_worker.runner.attention.backend import AttentionBackend
from gpu_worker.runner.forward.attention_op import layer_pools, step_context
from gpu_worker.runner.forward.decoder import Decoder, DecoderLayer
from gpu_worker.runner.graphs.capture import Graph, GraphCapture, Step
from gpu_worker.runner.graphs.decode import capture_each
from gpu_worker.runner.input_batch import InputBatch

logger = logging.getLogger(__name__)

_Out = TypeVar("_Out")

# Past this many tokens a step's GEMMs outweigh its launches, and padding would cost more than the
# graphs save (vLLM caps its capture sizes at 512 by default too); larger steps run eagerly.
MAX_PIECEWISE_TOKENS = 512


def token_buckets(max_num_batched_tokens: int) -> list[int]:
    """16, 32, 64, ... (doubling: at most half of a step is padding, and few graphs per layer), up to
    and including min(max_num_batched_tokens, MAX_PIECEWISE_TOKENS)."""
    top = min(max_num_batched_tokens, MAX_PIECEWISE_TOKENS)
    buckets = []
    size = 16
    while size < top:
        buckets.append(size)
        size *= 2
    return [*buckets, top]


@dataclass(frozen=True, slots=True)
class _Eager:
    """An uncaptured piece, run as a graph would be replayed."""

    step: Step

    def replay(self) -> None:
        self.step()


class PiecewiseGraphs:
    def __init__(
        self,
        model: Decoder,
        backend: AttentionBackend[Any],
        *,
        max_num_batched_tokens: int,
        device: torch.device,
        capture: GraphCapture | None,
        compile_backend: str | None = None,
    ) -> None:
        """`capture`: how pieces are captured (`CudaGraphCapture` on a GPU, the pool shared with the
        decode graphs); None runs every bucket eagerly from the padded buffers. `compile_backend`:
        torch.compile's, for the pieces (inductor on a GPU: fused norms, RoPE and SiLU), compiled at
        their first run (a capture's warm-up); None, or a failed compile, runs them uncompiled."""
        if model.takes_embeds or model.mrope:
            raise ValueError("piecewise CUDA graphs take token ids: a text decoder's steps only")
        self.model = model
        self.backend = backend
        self.buckets = token_buckets(max_num_batched_tokens)
        self._capture = capture
        self.layers: list[DecoderLayer] = list(model.layers)  # type: ignore[arg-type]  # nn.ModuleList
        size, first = self.buckets[-1], self.layers[0]
        hidden_size = int(model.config.get_text_config().hidden_size)
        num_heads, num_kv_heads = first.q_size // first.head_dim, first.kv_size // first.head_dim

        def buffer(*shape: int, dtype: torch.dtype = model.dtype) -> torch.Tensor:
            # Zeros, not empty: a warm-up reads them before any step wrote them.
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = buffer(size, dtype=torch.long)
        self.positions = buffer(size, dtype=torch.long)
        # Each row's LoRA slot, on a decoder with slots (padding rows: -1, the base model).
        self.lora_ids = None if model.lora_config is None else torch.full_like(self.input_ids, -1)
        self.cos = buffer(size, 1, first.head_dim)
        self.sin = buffer(size, 1, first.head_dim)
        # A layer's input (its residual); after the last layer, the final norm's output.
        self.hidden = buffer(size, hidden_size)
        self.q = buffer(size, num_heads, first.head_dim)
        self.k = buffer(size, num_kv_heads, first.head_dim)
        self.v = buffer(size, num_kv_heads, first.head_dim)
        self.attn = buffer(size, num_heads, first.head_dim)
        self._compiled: dict[Callable[..., Any], Callable[..., Any]] = {
            piece: torch.compile(piece, backend=compile_backend)
            for piece in (first_piece, layer_piece, last_piece)
            if compile_backend is not None
        }
        self._graphs: dict[int, list[Graph]] = {}  # per bucket, its pieces in order
        self.failed: dict[int, str] = {}  # buckets whose capture failed (they run eagerly), with why
        self.bucket_runs: dict[int, int] = dict.fromkeys(self.buckets, 0)  # steps served, per bucket

    def capture(self) -> None:
        """Capture every piece of every bucket (`capture_each`); a bucket any piece of which fails
        runs eagerly from the same buffers."""
        if self._capture is not None:
            self._graphs, self.failed = capture_each(
                self._capture, self.buckets, self._pieces, "piecewise steps", "tokens"
            )

    @property
    def num_runs(self) -> int:
        """Steps served from these buffers (tests and stats)."""
        return sum(self.bucket_runs.values())

    @property
    def captured_buckets(self) -> list[int]:
        """The token counts whose pieces replay as graphs, smallest first."""
        return sorted(self._graphs)

    def can_run(self, batch: InputBatch) -> bool:
        """A step of the backend these were built for, small enough for the largest bucket."""
        num_tokens = batch.input_ids.shape[1]
        return 0 < num_tokens <= self.buckets[-1] and batch.attn_metadata.backend is self.backend

    def run(self, batch: InputBatch) -> torch.Tensor:
        """Logits of the step's kept rows [N, vocab] (`batch.kept_indices`)."""
        num_tokens = batch.input_ids.shape[1]
        size = next(s for s in self.buckets if s >= num_tokens)
        self.input_ids[:num_tokens].copy_(batch.input_ids[0])
        self.positions[:num_tokens].copy_(batch.position_ids[0])
        if self.lora_ids is not None:
            if batch.lora_ids is None:
                self.lora_ids[:num_tokens].fill_(-1)
            else:
                self.lora_ids[:num_tokens].copy_(batch.lora_ids)
            self.lora_ids[num_tokens:size].fill_(-1)
        self.bucket_runs[size] += 1
        pieces = self._graphs.get(size) or [_Eager(piece) for piece in self._pieces(size)]
        context = batch.attn_metadata
        k_pools, v_pools = layer_pools(context)
        with step_context(context):
            pieces[0].replay()
            for layer, k_pool, v_pool, piece in zip(self.layers, k_pools, v_pools, pieces[1:], strict=True):
                q, k, v = self.q[:num_tokens], self.k[:num_tokens], self.v[:num_tokens]
                self.attn[:num_tokens].copy_(layer.attention(q, k, v, (k_pool, v_pool)))
                piece.replay()
        return self.model.lm_head(self.hidden[:num_tokens].index_select(0, batch.kept_indices))

    # ---- the pieces: each reads and writes only the static buffers' first `size` rows ---------------

    def _pieces(self, size: int) -> list[Step]:
        """The bucket's pieces in order: the first, then one after each layer's attention."""
        return [
            functools.partial(self._first, size),
            *(functools.partial(self._between, size, i) for i in range(len(self.layers))),
        ]

    def _first(self, size: int) -> None:
        """Embeddings, cos/sin and layer 0's pre-attention."""
        lora_ids = None if self.lora_ids is None else self.lora_ids[:size]
        outputs = self._call(first_piece, self.model, self.input_ids[:size], self.positions[:size], lora_ids)
        buffers = self.hidden, self.cos, self.sin, self.q, self.k, self.v
        for buffer, out in zip(buffers, outputs, strict=True):
            buffer[:size].copy_(out)

    def _between(self, size: int, i: int) -> None:
        """Layer i's post-attention, then layer i+1's pre-attention, or the final norm after the last."""
        lora_ids = None if self.lora_ids is None else self.lora_ids[:size]
        hidden, attn = self.hidden[:size], self.attn[:size]
        if i + 1 == len(self.layers):
            hidden.copy_(self._call(last_piece, self.model, self.layers[i], hidden, attn, lora_ids))
            return
        cos, sin = self.cos[:size], self.sin[:size]
        layers = self.layers[i], self.layers[i + 1]
        outputs = self._call(layer_piece, self.model, *layers, hidden, attn, cos, sin, lora_ids)
        for buffer, out in zip((self.hidden, self.q, self.k, self.v), outputs, strict=True):
            buffer[:size].copy_(out)

    def _call(self, piece: Callable[..., _Out], *args: Any) -> _Out:
        """`piece` compiled (when a backend was given and none of its compiles failed), else eager."""
        compiled = self._compiled.get(piece)
        if compiled is None:
            return piece(*args)
        try:
            # Floats (eps, scales) as constants, as the forward's compile takes them (compile.py).
            with torch._dynamo.config.patch(specialize_float=True):
                out: _Out = compiled(*args)
        except Exception as exc:  # a compile's failure; an error of the piece itself raises again below
            logger.warning(
                "compiling the piecewise graphs' pieces failed, they run uncompiled: %s: %s",
                type(exc).__name__,
                exc,
            )
            self._compiled.clear()
            return piece(*args)
        return out


# The pieces as functions of the modules they run (layers passed in, not looked up by index): one
# compiled graph serves every layer, their weights its inputs (dynamo's inlined nn modules).
# Copies into the static buffers stay outside, so nothing compiled mutates an input.


def first_piece(
    model: Decoder, input_ids: torch.Tensor, positions: torch.Tensor, lora_ids: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    """-> hidden, cos, sin, then layer 0's q, k, v."""
    hidden = model.embed_tokens(input_ids)
    cos, sin = model.rope(hidden, positions)
    first: DecoderLayer = model.layers[0]  # type: ignore[assignment]  # nn.ModuleList
    q, k, v = first.pre_attention(hidden, cos, sin, model.lora_step(lora_ids))
    return hidden, cos, sin, q, k, v


def layer_piece(
    model: Decoder,
    layer: DecoderLayer,
    next_layer: DecoderLayer,
    hidden: torch.Tensor,
    attn: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    lora_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """-> `layer`'s output (the next one's residual), then `next_layer`'s q, k, v."""
    # Made again in each piece from the slots (a few small ops): no piece's output outlives it.
    lora = model.lora_step(lora_ids)
    hidden = layer.post_attention(hidden, attn, lora)
    return hidden, *next_layer.pre_attention(hidden, cos, sin, lora)


def last_piece(
    model: Decoder,
    layer: DecoderLayer,
    hidden: torch.Tensor,
    attn: torch.Tensor,
    lora_ids: torch.Tensor | None,
) -> torch.Tensor:
    """-> the final norm of the last layer's output."""
    normed: torch.Tensor = model.norm(layer.post_attention(hidden, attn, model.lora_step(lora_ids)))
    return normed
