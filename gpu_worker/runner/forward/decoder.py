"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over one flattened ragged batch, sliding
windows included (Mistral's for every layer, Qwen2/3's from `max_window_layers` on).

Built from the transformers model with the same weights: q/k/v become one GEMM and gate/up another
(vLLM's QKVParallelLinear / MergedColumnParallelLinear), RMSNorm and RoPE are written as plain tensor
ops that inductor fuses, and attention is an opaque op (`cbserve::paged_attention`, or its C++ twin
on the CPU: attention_op.py). The arithmetic is
transformers' own, op for op (RMSNorm in float32, RoPE from the model's rotary module), so greedy
output stays equal to `generate`. With LoRA slots (WORKER_ENABLE_LORA, gpu_worker/runner/lora/),
each fused linear adds its adapters' deltas to its output, in the columns of the projection each
adapts, for the step's tokens of each adapter at once; the base weights are never changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from gpu_worker.runner.attention.backend import AttentionContext
from gpu_worker.runner.forward.attention_op import layer_pools, native_attention, step_context
from gpu_worker.runner.forward.linear import Linear
from gpu_worker.runner.lora.layers import LoRAConfig, LoRALayer
from gpu_worker.runner.lora.step import LoRAStep, make_lora_step
from gpu_worker.settings import Quantization

FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


@dataclass(slots=True)
class DecoderOutput:
    logits: torch.Tensor  # [1, N, vocab], as transformers' CausalLMOutput


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach(), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def _merged(linears: list[nn.Linear], quantization: Quantization | None) -> Linear:
    weight = torch.cat([lin.weight for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
    return Linear(weight, bias, quantization)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        hf_layer: Any,
        layer_idx: int,
        quantization: Quantization | None,
        native_attention: bool,
        lora: LoRAConfig | None = None,
    ) -> None:
        super().__init__()
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        self.layer_idx = layer_idx
        self.native_attention = native_attention  # the C++ op (attention_op.py)
        self.head_dim = int(attn.head_dim)
        self.q_size = attn.q_proj.out_features
        self.kv_size = attn.k_proj.out_features
        self.scale = float(attn.scaling)
        # Qwen2/3 set it per layer; Mistral reads its config's for every layer.
        window = getattr(attn, "sliding_window", getattr(attn.config, "sliding_window", None))
        self.window: int | None = None if window is None else int(window)
        self.input_layernorm = RMSNorm(
            hf_layer.input_layernorm.weight, hf_layer.input_layernorm.variance_epsilon
        )
        post = hf_layer.post_attention_layernorm
        self.post_attention_layernorm = RMSNorm(post.weight, post.variance_epsilon)
        self.qkv_proj = _merged([attn.q_proj, attn.k_proj, attn.v_proj], quantization)
        self.o_proj = Linear(attn.o_proj.weight, attn.o_proj.bias, quantization)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)  # Qwen3
        self.q_norm = None if q_norm is None else RMSNorm(q_norm.weight, q_norm.variance_epsilon)
        self.k_norm = None if k_norm is None else RMSNorm(k_norm.weight, k_norm.variance_epsilon)
        self.gate_up_proj = _merged([mlp.gate_proj, mlp.up_proj], quantization)
        self.intermediate_size = mlp.gate_proj.out_features
        self.down_proj = Linear(mlp.down_proj.weight, mlp.down_proj.bias, quantization)
        self.act_fn: Callable[[torch.Tensor], torch.Tensor] = mlp.act_fn
        weight = attn.q_proj.weight
        self.lora = (
            None
            if lora is None
            else LoRALayer(
                attn.q_proj.in_features,
                self.q_size,
                self.kv_size,
                self.intermediate_size,
                lora,
                weight.dtype,
                weight.device,
            )
        )

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        pools: tuple[torch.Tensor, torch.Tensor],
        lora: LoRAStep | None = None,
    ) -> torch.Tensor:
        """hidden [T, hidden], cos/sin [T, 1, head_dim], this layer's K and V pools (written) ->
        [T, hidden]; `lora`: the step's adapters. Three parts, so that the piecewise CUDA graphs
        (gpu_worker/runner/graphs/piecewise.py) can capture what is around attention and run it alone."""
        q, k, v = self.pre_attention(hidden, cos, sin, lora)
        return self.post_attention(hidden, self.attention(q, k, v, pools), lora)

    def pre_attention(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lora: LoRAStep | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden [T, hidden] -> q [T, H, D], k and v [T, KVH, D]: input norm, q/k/v, q/k norms, RoPE."""
        normed = self.input_layernorm(hidden)
        qkv = self.qkv_proj(normed)
        if lora is not None and self.lora is not None:
            qkv = qkv + self.lora.qkv.delta(normed, lora)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(q.shape[0], -1, self.head_dim)
        k = k.view(k.shape[0], -1, self.head_dim)
        v = v.view(v.shape[0], -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pools: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """Paged attention over the step's context (attention_op.py), K/V written -> [T, H, D]."""
        op = (
            torch.ops.cbserve_cpu.paged_attention
            if self.native_attention
            else torch.ops.cbserve.paged_attention
        )
        attn: torch.Tensor = op(q, k, v, *pools, self.layer_idx, self.scale, self.window)
        return attn

    def post_attention(
        self, hidden: torch.Tensor, attn: torch.Tensor, lora: LoRAStep | None = None
    ) -> torch.Tensor:
        """The layer's input `hidden` [T, hidden] (the residual) and attention's output [T, H, D] ->
        [T, hidden]: o_proj, residual, post-attention norm, MLP, residual."""
        residual = hidden
        attn = attn.flatten(1)
        out = self.o_proj(attn)
        if lora is not None and self.lora is not None:
            out = out + self.lora.o.delta(attn, lora)
        hidden = residual + out
        residual = hidden
        normed = self.post_attention_layernorm(hidden)
        gate_up = self.gate_up_proj(normed)
        if lora is not None and self.lora is not None:
            gate_up = gate_up + self.lora.gate_up.delta(normed, lora)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        act = self.act_fn(gate) * up
        out = self.down_proj(act)
        if lora is not None and self.lora is not None:
            out = out + self.lora.down.delta(act, lora)
        return residual + out


class Decoder(nn.Module):
    """Called like the transformers model it replaces: `model(input_ids=[1, T], position_ids=[1, T],
    logits_to_keep=[N], attn_metadata=context)` -> `.logits` [1, N, vocab]; with LoRA slots, also
    `lora_ids=[T]`, each token's slot (-1: the base model)."""

    def __init__(
        self,
        hf_model: PreTrainedModel,
        quantization: Quantization | None,
        lora: LoRAConfig | None = None,
        language_model: nn.Module | None = None,
    ) -> None:
        """`language_model`: the text model inside a vision-language model (multimodal/vision_model.py),
        which then calls it with the step's input embeddings; by default `hf_model.model`, called with ids."""
        super().__init__()
        inner: Any = hf_model.model if language_model is None else language_model
        # A vision-language model's decoder takes embeddings (images merged in), not token ids.
        self.takes_embeds = language_model is not None
        # Qwen2.5-VL's M-RoPE: three position rows (temporal, height, width) per token.
        self.mrope = hasattr(inner.rotary_emb, "mrope_section")
        self.config = hf_model.config
        self.dtype = hf_model.dtype
        self.embed_tokens = inner.embed_tokens
        self.rotary_emb = inner.rotary_emb
        native = native_attention(hf_model.device)
        self.layers = nn.ModuleList(
            [DecoderLayer(layer, i, quantization, native, lora) for i, layer in enumerate(inner.layers)]
        )
        self.lora_config = lora
        self.norm = RMSNorm(inner.norm.weight, inner.norm.variance_epsilon)
        lm_head = hf_model.lm_head
        self.lm_head = Linear(lm_head.weight, lm_head.bias, quantization)
        self.generation_config = hf_model.generation_config
        # The KV pools' block size and dtype, as the worker will allocate them: the compiled forward
        # takes the pools as inputs (attention_op.py), and is compiled before they exist.
        self.pool_layout: tuple[int, torch.dtype] = (16, self.dtype)
        # The compiled callable of `logits_of` (compile.py); `logits_of` itself until then.
        self.run: Callable[..., torch.Tensor] = self.logits_of

    @property
    def lora_layers(self) -> list[LoRALayer]:
        """Each layer's LoRA slots; empty without LoRA."""
        layers: list[DecoderLayer] = list(self.layers)  # type: ignore[arg-type]  # nn.ModuleList
        return [layer.lora for layer in layers if layer.lora is not None]

    def logits_of(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kept: torch.Tensor,
        k_pools: list[torch.Tensor],
        v_pools: list[torch.Tensor],
        lora_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids [T] (embeddings [T, hidden] when `takes_embeds`), positions [T] ([T, 3] with
        M-RoPE), kept [N], each layer's K and V pool (and lora_ids [T] with LoRA slots) -> logits
        [N, vocab]: what is compiled."""
        hidden = input_ids if self.takes_embeds else self.embed_tokens(input_ids)
        cos, sin = self.rope(hidden, positions)
        if lora_ids is not None:
            # Two unbacked token counts to the compiler: they are one.
            torch._check(lora_ids.shape[0] == input_ids.shape[0])
        lora = self.lora_step(lora_ids)
        for layer, pools in zip(self.layers, zip(k_pools, v_pools, strict=True), strict=True):
            hidden = layer(hidden, cos, sin, pools, lora)
        return self.lm_head(self.norm(hidden.index_select(0, kept)))

    def rope(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, hidden] (for its dtype), positions [T] ([T, 3] with M-RoPE) -> cos, sin
        [T, 1, head_dim]: broadcast over heads."""
        # M-RoPE's rotary module takes [3, 1, T] and merges its sections itself: cos/sin come out [1, T, d].
        rope_positions = positions.t().unsqueeze(1) if self.mrope else positions.unsqueeze(0)
        cos, sin = self.rotary_emb(hidden, rope_positions)
        return cos[0].unsqueeze(1), sin[0].unsqueeze(1)

    def lora_step(self, lora_ids: torch.Tensor | None) -> LoRAStep | None:
        """The step's adapters from each token's slot; None without LoRA slots."""
        if lora_ids is None or self.lora_config is None:
            return None
        config = self.lora_config
        return make_lora_step(lora_ids, config.max_loras, config.kernel, self.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        logits_to_keep: torch.Tensor | int,
        attn_metadata: AttentionContext,
        use_cache: bool = False,
        lora_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> DecoderOutput:
        """`inputs_embeds` [1, T, hidden]: a vision-language model's step (images merged), in place of
        `input_ids`; `position_ids` [1, T, 3] with M-RoPE."""
        del use_cache  # the paged pool is the cache
        # Copies, not views of [1, T]: the compiled graph would guard on the base's size too.
        tokens = input_ids if inputs_embeds is None else inputs_embeds
        ids, positions = tokens[0].clone(), position_ids[0].clone()
        if isinstance(logits_to_keep, int):  # 0: every row (transformers' meaning)
            # Made on the device: a decode graph captures this (gpu_worker/runner/graphs/decode.py), and a
            # capture refuses a copy from the host (tests/unit/gpu_worker/test_capture_rules.py).
            num_tokens = ids.shape[0]
            first = num_tokens - logits_to_keep if logits_to_keep else 0
            logits_to_keep = torch.arange(first, num_tokens, device=ids.device)
        # A copy too: made here, under the runner's inference mode, like ids and positions. Rows made
        # outside it (a decode step's) and inside it (with drafts) differ in dispatch keys, which
        # the graph guards on: the first step with drafts recompiled it (~2 s).
        kept = logits_to_keep.clone()
        inputs: list[Any] = [ids, positions, kept, *layer_pools(attn_metadata)]
        if self.lora_config is not None:
            # Every call passes the slots, -1 (the base model) when the caller names none (the profiling
            # step, a draft model's, a benchmark's), so one graph serves them all.
            inputs.append(torch.full_like(ids, -1) if lora_ids is None else lora_ids.clone())
        with step_context(attn_metadata):
            return DecoderOutput(logits=self.run(*inputs).unsqueeze(0))
