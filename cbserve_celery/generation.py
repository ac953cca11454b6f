"""One generation through the stream protocol, safe to run again for the same request id.

Celery may run a task twice (a worker died before acknowledging it, or the visibility timeout ran out
while it was still running). The request id comes from the task id, and `submit_once` submits it only
the first time, so a second run follows the same request's token stream (from its start, which the
stream keeps for its resume window after the end) instead of generating it again.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import msgspec
import redis

from common.protocol import GenerateRequest, LoRARequest, MultiModalFeature, SamplingParams
from common.stream_client import abort, follow, submit_once
from common.streams import placed_req_id
from common.token_rules import RequestFailed, RequestTimedOut


class GenerationFailed(Exception):
    """The request failed in cbserve (or timed out); the message says why."""


def req_id_for_task(task_id: str) -> str:
    # Celery task ids are random UUIDs unless a caller picks one: as unguessable as the gateway's ids.
    return f"celery-{task_id}"


def task_req_id(task_id: str, cells: list[str]) -> str:
    """The task's request id, placed in one of `cells` by the task id: each run of the task alike."""
    return placed_req_id(cells[zlib.crc32(task_id.encode()) % len(cells)], req_id_for_task(task_id))


def parse_sampling_params(raw: dict[str, Any] | None) -> SamplingParams:
    """JSON sampling parameters (SamplingParams' field names) into the Struct, checked."""
    try:
        return msgspec.convert(raw or {}, SamplingParams, strict=False)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid sampling_params: {exc}") from exc


def run_generation(
    r: redis.Redis,
    req_id: str,
    prompt_token_ids: list[int],
    params: SamplingParams,
    *,
    timeout_s: float,
    owner: str = "celery",
    mm_features: list[MultiModalFeature] | None = None,
    lora_request: LoRARequest | None = None,
) -> tuple[list[int], str]:
    """Submit (unless already submitted) and follow to the end: (generated token ids, finish reason)."""
    if not prompt_token_ids:
        raise ValueError("the prompt is empty")
    request = GenerateRequest(
        req_id=req_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=params,
        arrival_time=time.time(),
        owner=owner,
        mm_features=mm_features,
        lora_request=lora_request,
    )
    submit_once(r, request)
    token_ids: list[int] = []
    finish_reason = "stop"
    try:
        for event in follow(r, req_id, timeout_s=timeout_s):
            token_ids.append(event.token_id)
            finish_reason = event.finish_reason or finish_reason
    except RequestTimedOut:
        abort(r, req_id)
        raise GenerationFailed(f"request {req_id} did not finish within {timeout_s:.0f} s") from None
    except RequestFailed as exc:
        raise GenerationFailed(f"{exc.error.code}: {exc.error.message}") from None
    return token_ids, finish_reason
