"""OpenAI's stored chat completions (`store: true`), per API key: GET /v1/chat/completions (a page,
filtered by `metadata[key]=value` and `model`), GET / POST (its metadata) / DELETE
/v1/chat/completions/{id}, GET /v1/chat/completions/{id}/messages."""

from __future__ import annotations

import re
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from gateway.app_state import State
from gateway.generation.stored import store_of
from gateway.security.auth import request_owner
from openai_frontend.generate.options import checked_metadata
from openai_frontend.protocol.errors import invalid_request
from openai_frontend.protocol.list_page import list_page

router = APIRouter()
MAX_LIMIT = 100
_METADATA_PARAM = re.compile(r"metadata\[(.+)\]")


class MetadataUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    metadata: dict[str, str] | None = Field(...)  # replaces the stored metadata; null clears it


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise invalid_request(f"limit must be in [1, {MAX_LIMIT}], got {limit}", "limit")
    return limit


@router.get("/v1/chat/completions")
async def list_completions(
    http_request: Request,
    state: State,
    after: str | None = None,
    limit: int = 20,
    order: Literal["asc", "desc"] = "asc",
    model: str | None = None,
) -> dict[str, Any]:
    # OpenAI's deep-object query: metadata[key]=value, every pair must match.
    wanted = {
        m.group(1): value
        for name, value in http_request.query_params.items()
        if (m := _METADATA_PARAM.fullmatch(name))
    }
    found, has_more = await store_of(state).list(
        request_owner(http_request),
        after=after,
        limit=_limit(limit),
        newest_first=order == "desc",
        metadata=wanted,
        model=model,
    )
    return list_page(found, has_more)


@router.get("/v1/chat/completions/{completion_id}")
async def get_completion(completion_id: str, http_request: Request, state: State) -> dict[str, Any]:
    return await store_of(state).get(request_owner(http_request), completion_id)


@router.post("/v1/chat/completions/{completion_id}")
async def update_completion(
    completion_id: str, body: MetadataUpdate, http_request: Request, state: State
) -> dict[str, Any]:
    metadata = checked_metadata(body.metadata)
    return await store_of(state).update(request_owner(http_request), completion_id, metadata)


@router.delete("/v1/chat/completions/{completion_id}")
async def delete_completion(completion_id: str, http_request: Request, state: State) -> dict[str, Any]:
    await store_of(state).delete(request_owner(http_request), completion_id)
    return {"object": "chat.completion.deleted", "id": completion_id, "deleted": True}


@router.get("/v1/chat/completions/{completion_id}/messages")
async def completion_messages(
    completion_id: str,
    http_request: Request,
    state: State,
    after: str | None = None,
    limit: int = 20,
    order: Literal["asc", "desc"] = "asc",
) -> dict[str, Any]:
    messages = await store_of(state).messages(request_owner(http_request), completion_id)
    if order == "desc":
        messages.reverse()
    ids = [m["id"] for m in messages]
    start = ids.index(after) + 1 if after in ids else 0
    page = messages[start : start + _limit(limit)]
    return list_page(page, start + len(page) < len(messages))
