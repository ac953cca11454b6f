"""Which worker may run a request, by kind: pooling requests only on pooling workers (vLLM's
`--runner pooling`) and generation only on the others, each checked against what the worker says it
serves (tasks, Matryoshka sizes, a prompt computed whole by an encoder). No I/O.

A request no worker of its cell can ever run fails at once with the reason (`refusal`); one that
another worker of the cell runs is passed over by this one (`other_kind`).
"""

from __future__ import annotations

from batcher.core.request import Request
from common.protocol import PoolingParams, WorkerInfo


def refusal(info: WorkerInfo, max_num_batched_tokens: int, req: Request) -> str | None:
    """Why a worker of `info` can never run `req` (None: it can, KV blocks aside)."""
    params = req.pooling_params
    if params is None:
        if info.runner == "pooling":
            tasks = ", ".join(info.pooling_tasks)
            return f"model {info.model!r} is a pooling model (runner pooling, {tasks}): it generates no text"
        return None
    if info.runner != "pooling":
        return f"model {info.model!r} generates text: a {params.task} request needs a pooling model"
    if params.task not in info.pooling_tasks:
        tasks = ", ".join(info.pooling_tasks)
        return f"model {info.model!r} serves {tasks}, not {params.task}"
    num_tokens = len(req.prompt_token_ids)
    if num_tokens > info.max_model_len:
        return (
            f"the prompt has {num_tokens} tokens, over max_model_len {info.max_model_len}: "
            "shorten it or set truncate_prompt_tokens"
        )
    if not info.chunked_prefill and num_tokens > max_num_batched_tokens:
        return (
            f"the prompt has {num_tokens} tokens, over the step budget ({max_num_batched_tokens}) of an "
            "encoder model, which computes a prompt whole: shorten it, set truncate_prompt_tokens, or "
            "raise WORKER_MAX_NUM_BATCHED_TOKENS"
        )
    return dimensions_refusal(info, params)


def dimensions_refusal(info: WorkerInfo, params: PoolingParams) -> str | None:
    """Why `params.dimensions` cannot be served (vLLM's rule: Matryoshka models only)."""
    if params.dimensions is None:
        return None
    if params.task != "embed":
        return f"dimensions applies to embed requests, not {params.task}"
    if not info.is_matryoshka:
        return f"model {info.model!r} does not support matryoshka representation: dimensions is not allowed"
    allowed = info.matryoshka_dimensions
    if allowed and params.dimensions not in allowed:
        return f"model {info.model!r} supports dimensions {allowed}, not {params.dimensions}"
    if not 1 <= params.dimensions <= info.embed_dim:
        return f"dimensions must be between 1 and the model's {info.embed_dim}, not {params.dimensions}"
    return None


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
