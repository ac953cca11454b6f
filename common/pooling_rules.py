"""Which requests a worker can never run, by kind (docs/architecture.md, *Pooling models*): a
pooling request needs a pooling worker (`WorkerInfo.runner`) serving its task, within its length,
an encoder's step budget and its Matryoshka sizes; a generation needs a generating worker. The
batcher fails such a request with the reason (batcher/core/pooling.py), and the gateway refuses it
with the same words before queueing it."""

from __future__ import annotations

from common.protocol import PoolingParams, PoolingTask, WorkerInfo

# What a generation model does not serve, by the pooling task asked of it.
_SERVED_BY_TASK: dict[PoolingTask, str] = {
    "embed": "embeddings",
    "classify": "classification",
    "score": "scores",
}


def refusal(
    info: WorkerInfo, max_num_batched_tokens: int, params: PoolingParams | None, num_prompt_tokens: int
) -> str | None:
    """Why a worker of `info` can never run a request of `params` (None for a generation) with a
    prompt of `num_prompt_tokens`; None when it can, KV blocks aside."""
    if params is None:
        if info.runner == "pooling":
            tasks = ", ".join(info.pooling_tasks)
            return f"model {info.model!r} is a pooling model (runner pooling, {tasks}): it generates no text"
        return None
    if info.runner != "pooling":
        return (
            f"model {info.model!r} generates text and does not serve {_SERVED_BY_TASK[params.task]}: "
            f"{params.task} requests need a pooling model"
        )
    if params.task not in info.pooling_tasks:
        tasks = ", ".join(info.pooling_tasks)
        return f"model {info.model!r} serves {tasks}, not {params.task}"
    if num_prompt_tokens > info.max_model_len:
        return (
            f"the prompt has {num_prompt_tokens} tokens, over max_model_len {info.max_model_len}: "
            "shorten it or set truncate_prompt_tokens"
        )
    if not info.chunked_prefill and num_prompt_tokens > max_num_batched_tokens:
        return (
            f"the prompt has {num_prompt_tokens} tokens, over the step budget ({max_num_batched_tokens}) of "
            "an encoder model, which computes a prompt whole: shorten it, set truncate_prompt_tokens, or "
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
