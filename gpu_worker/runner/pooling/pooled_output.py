"""What a pooled hidden state (or a head's logits) becomes for the request that asked (vLLM's pooler
heads): an embedding cut to its Matryoshka `dimensions` and normalized, class scores through the
classifier's activation, a pair's score through the cross-encoder's; sent as float32 bytes in the
request's `PoolingEvent`."""

from __future__ import annotations

import struct

import torch
import torch.nn.functional as F

from common.protocol import PoolingEvent, PoolingParams
from gpu_worker.runner.pooling.model_files import Activation, PoolingSpec


def pooled_values(raw: torch.Tensor, params: PoolingParams, spec: PoolingSpec) -> torch.Tensor:
    """`raw` [D]: the pooled hidden state (embed) or the head's logits (classify, score), in float32."""
    values = raw.float()
    if params.task == "embed":
        if params.dimensions is not None:
            values = values[: params.dimensions]  # Matryoshka: cut first, then normalize (vLLM)
        normalize = spec.normalize if params.normalize is None else params.normalize
        return F.normalize(values, dim=-1) if normalize else values
    if params.activation is False:
        return values
    if params.task == "score":
        return activate(values, spec.score_activation)
    # vLLM's classify: a sigmoid for one label, a softmax over several.
    return activate(values, "sigmoid" if values.shape[-1] == 1 else "softmax")


def activate(values: torch.Tensor, activation: Activation) -> torch.Tensor:
    if activation == "sigmoid":
        return torch.sigmoid(values)
    if activation == "softmax":
        return torch.softmax(values, dim=-1)
    if activation == "tanh":
        return torch.tanh(values)
    return values


def pooling_event(
    req_id: str, attempt: int, values: torch.Tensor, num_prompt_tokens: int, num_cached_tokens: int
) -> PoolingEvent:
    floats = values.detach().cpu().tolist()
    return PoolingEvent(
        req_id=req_id,
        attempt=attempt,
        data=struct.pack(f"<{len(floats)}f", *floats),
        num_prompt_tokens=num_prompt_tokens,
        num_cached_tokens=num_cached_tokens,
    )
