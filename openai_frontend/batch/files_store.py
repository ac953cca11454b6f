"""Files of the OpenAI Files API in Redis: bounded in size, owned by the API key that made them.

One hash per file (`meta`, `content`) that expires with the file, and per owner a sorted set of ids
for listing. Another key's file answers exactly as an unknown id, so ids cannot be probed. Batch
input files are uploaded here; batch output and error files are written here by the batch task.
"""

from __future__ import annotations

import secrets
import time
from typing import Literal

import msgspec
import redis.asyncio as aioredis
from pydantic import BaseModel

from common.redis_io.redis_conn import as_bytes
from common.streams import file_key, owner_files
from openai_frontend.batch.owner_index import page

_META, _CONTENT = b"meta", b"content"


class FileMeta(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    bytes: int  # size of the content
    created_at: int  # unix seconds
    expires_at: int  # unix seconds; the file is gone after this
    filename: str
    purpose: str  # "batch" (uploaded), "batch_output" (written by a batch)
    owner: str  # the API key's name; never shown


class FileObject(BaseModel):
    """The OpenAI file object."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    status_details: str | None = None

    @classmethod
    def of(cls, meta: FileMeta) -> FileObject:
        """The file as OpenAI shows it: the meta's fields of the same names (never its owner)."""
        return cls.model_validate(meta, from_attributes=True)


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


class FileStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def put(
        self, owner: str, filename: str, purpose: str, content: bytes, *, expires_at: int, file_id: str = ""
    ) -> FileMeta:
        """Store a file (a new id unless `file_id` is given: writing the same id again replaces it)."""
        now = time.time()
        meta = FileMeta(
            id=file_id or new_file_id(),
            bytes=len(content),
            created_at=int(now),
            expires_at=expires_at,
            filename=filename,
            purpose=purpose,
            owner=owner,
        )
        key = file_key(meta.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={_META: msgspec.json.encode(meta), _CONTENT: content})
            pipe.expireat(key, expires_at)
            pipe.zadd(owner_files(owner), {meta.id: now})
            await pipe.execute()
        return meta

    async def get(self, owner: str, file_id: str) -> FileMeta | None:
        raw = await self._redis.hget(file_key(file_id), _META)
        meta = None if raw is None else msgspec.json.decode(raw, type=FileMeta)
        return meta if meta is not None and meta.owner == owner else None

    async def content(self, owner: str, file_id: str) -> bytes | None:
        if await self.get(owner, file_id) is None:
            return None
        content = await self._redis.hget(file_key(file_id), _CONTENT)
        return None if content is None else as_bytes(content)

    async def delete(self, owner: str, file_id: str) -> bool:
        if await self.get(owner, file_id) is None:
            return False
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(file_key(file_id))
            pipe.zrem(owner_files(owner), file_id)
            await pipe.execute()
        return True

    async def listing(
        self, owner: str, *, purpose: str | None, after: str | None, limit: int, newest_first: bool
    ) -> tuple[list[FileMeta], bool]:
        async def load(ids: list[str]) -> list[FileMeta | None]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for file_id in ids:
                    pipe.hget(file_key(file_id), _META)
                raws = await pipe.execute()
            return [None if raw is None else msgspec.json.decode(raw, type=FileMeta) for raw in raws]

        return await page(
            self._redis,
            owner_files(owner),
            load,
            after=after,
            limit=limit,
            newest_first=newest_first,
            keep=lambda meta: purpose is None or meta.purpose == purpose,
        )
