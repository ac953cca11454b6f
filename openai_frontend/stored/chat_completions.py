"""Stored chat completions in Redis: OpenAI's `store: true`, read back per API key.

One hash per completion (`llm:{api}:chatcmpl:{id}`): `completion` (the chat.completion body as it
was answered), `messages` (the conversation as the client sent it), `metadata`, `model`; a TTL of
GATEWAY_STORED_COMPLETIONS_TTL_S. Each key's ids sit in a sorted set scored by creation time, for
listing (batch/owner_index.py drops the ids of expired ones). Another key's completion answers
exactly as an unknown id, as files and batches do.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis.asyncio as aioredis

from common.redis_io.redis_conn import as_str
from common.streams import owner_stored_chats, stored_chat_key
from openai_frontend.batch.owner_index import page
from openai_frontend.protocol.errors import OpenAIError

_COMPLETION, _MESSAGES, _METADATA, _OWNER = "completion", "messages", "metadata", "owner"


def not_found(completion_id: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"No chat completion found with id {completion_id!r} (unknown, expired, or not yours)",
        code="not_found",
    )


class StoredChatCompletions:
    def __init__(self, redis: aioredis.Redis, ttl_s: int) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    async def save(
        self, owner: str, completion: dict[str, Any], messages: list[dict[str, Any]], metadata: dict[str, str]
    ) -> None:
        """Keep an answered completion (its `id` names it) with the messages that asked for it."""
        key, index = stored_chat_key(completion["id"]), owner_stored_chats(owner)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                key,
                mapping={
                    _OWNER: owner,
                    _COMPLETION: json.dumps(completion),
                    _MESSAGES: json.dumps(messages),
                    _METADATA: json.dumps(metadata),
                },
            )
            pipe.expire(key, self._ttl_s)
            pipe.zadd(index, {completion["id"]: time.time()})
            pipe.expire(index, self._ttl_s)
            await pipe.execute()

    async def _fields(self, owner: str, completion_id: str) -> dict[str, str]:
        raw: Any = await self._redis.hgetall(stored_chat_key(completion_id))
        fields = {as_str(k): as_str(v) for k, v in raw.items()}
        if not fields or fields[_OWNER] != owner:
            raise not_found(completion_id)
        return fields

    async def get(self, owner: str, completion_id: str) -> dict[str, Any]:
        return _completion(await self._fields(owner, completion_id))

    async def messages(self, owner: str, completion_id: str) -> list[dict[str, Any]]:
        """The conversation as sent, each message with its own id (`<completion id>-<index>`)."""
        messages = json.loads((await self._fields(owner, completion_id))[_MESSAGES])
        return [{"id": f"{completion_id}-{i}", **m} for i, m in enumerate(messages)]

    async def update(self, owner: str, completion_id: str, metadata: dict[str, str]) -> dict[str, Any]:
        """Replace its metadata (the only field OpenAI lets a client change)."""
        fields = await self._fields(owner, completion_id)
        await self._redis.hset(stored_chat_key(completion_id), _METADATA, json.dumps(metadata))
        return _completion({**fields, _METADATA: json.dumps(metadata)})

    async def delete(self, owner: str, completion_id: str) -> None:
        await self._fields(owner, completion_id)
        await self._redis.delete(stored_chat_key(completion_id))
        await self._redis.zrem(owner_stored_chats(owner), completion_id)

    async def list(
        self,
        owner: str,
        *,
        after: str | None,
        limit: int,
        newest_first: bool,
        metadata: dict[str, str],
        model: str | None,
    ) -> tuple[list[dict[str, Any]], bool]:
        """A page of this key's completions whose metadata holds every pair of `metadata`."""

        async def load(ids: list[str]) -> list[dict[str, Any] | None]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for completion_id in ids:
                    pipe.hgetall(stored_chat_key(completion_id))
                replies: list[Any] = await pipe.execute()
            return [_completion({as_str(k): as_str(v) for k, v in r.items()}) if r else None for r in replies]

        def keep(completion: dict[str, Any]) -> bool:
            held = completion["metadata"]
            return all(held.get(k) == v for k, v in metadata.items()) and model in (None, completion["model"])

        index = owner_stored_chats(owner)
        return await page(
            self._redis, index, load, after=after, limit=limit, newest_first=newest_first, keep=keep
        )


def _completion(fields: dict[str, str]) -> dict[str, Any]:
    return {**json.loads(fields[_COMPLETION]), "metadata": json.loads(fields[_METADATA])}
