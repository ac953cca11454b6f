"""Which worker may run a request, by kind: pooling requests only on pooling workers (vLLM's
`--runner pooling`) and generation only on the others, each checked against what the worker says it
serves (tasks, Matryoshka sizes, a prompt computed whole by an encoder). No I/O.

A request no worker of its cell can ever run fails at once with the reason (`refusal`); one that
another worker of the cell runs is passed over by this one (`other_kind`). The rules themselves are
common/pooling_rules.py's, which the gateway asks too.
"""

from __future__ import annotations

from batcher.core.request import Request
from common.pooling_rules import refusal as pooling_refusal
from common.protocol import WorkerInfo


def refusal(info: WorkerInfo, max_num_batched_tokens: int, req: Request) -> str | None:
    """Why a worker of `info` can never run `req` (None: it can, KV blocks aside)."""
    if req.mm_features and not info.supports_multimodal:
        return f"model {info.model!r} takes no images: it is not a vision-language model the worker serves"
    return pooling_refusal(info, max_num_batched_tokens, req.pooling_params, len(req.prompt_token_ids))


def fit_prompt(req: Request, max_model_len: int) -> None:
    """`truncate_prompt_tokens` -1 (vLLM: the model's length): keep the last `max_model_len` tokens,
    known once a worker is in view (k > 0 is applied when the request is read)."""
    params = req.pooling_params
    if params is None or params.truncate_prompt_tokens != -1 or len(req.prompt_token_ids) <= max_model_len:
        return
    req.prompt_token_ids = req.prompt_token_ids[-max_model_len:]
    if req.token_type_ids is not None:
        req.token_type_ids = req.token_type_ids[-max_model_len:]
    req.block_hashes, req.hash_block_size = [], 0  # hashed from the tokens it no longer has


def is_pooling_worker(info: WorkerInfo) -> bool:
    return info.runner == "pooling"


def other_kind(info: WorkerInfo, req: Request) -> bool:
    """`req` is a pooling request and the worker generates, or the reverse."""
    return (req.pooling_params is not None) != is_pooling_worker(info)
