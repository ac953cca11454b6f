"""Per-key quotas on what a key keeps in Redis: uploaded files (count and bytes) and batches in flight.

Without them one key could fill Redis through the Files API (files live 30 days) and take every
Celery worker with batches. Usage is read from the key's own listings when it asks for more (expired
files and finished batches do not count), so the quotas hold across gateways; uploads or batches of
one key made at the same instant can pass a quota together (soft, by at most those in flight). Files
written by batches (their output and error files) do not count: a key bounds them through its
batches. Without API keys every client is one key: the quotas are then the server's.
"""

from __future__ import annotations

from openai_frontend.batch.files_store import FileStore
from openai_frontend.batch.objects import ACTIVE
from openai_frontend.batch.store import BatchStore
from openai_frontend.protocol.errors import OpenAIError

_ALL = 100_000  # more than any quota: a listing of everything a key holds


async def check_file_quota(
    files: FileStore, owner: str, num_bytes: int, max_files: int, max_bytes: int
) -> None:
    """Refuse an upload of `num_bytes` that would pass the key's file quotas (0: no quota)."""
    if not max_files and not max_bytes:
        return
    stored, _ = await files.listing(owner, purpose="batch", after=None, limit=_ALL, newest_first=True)
    if max_files and len(stored) + 1 > max_files:
        raise OpenAIError(
            429,
            f"this API key already stores {len(stored)} files, its quota (GATEWAY_MAX_FILES_PER_KEY "
            f"{max_files}); delete some (DELETE /v1/files/{{id}}) or wait for them to expire",
            param="file",
            code="file_quota_exceeded",
        )
    used = sum(meta.bytes for meta in stored)
    if max_bytes and used + num_bytes > max_bytes:
        raise OpenAIError(
            413,
            f"this API key stores {used} bytes of files; {num_bytes} more would pass its quota "
            f"(GATEWAY_MAX_FILE_BYTES_PER_KEY {max_bytes}); delete some files (DELETE /v1/files/{{id}})",
            param="file",
            code="file_quota_exceeded",
        )


async def check_batch_quota(batches: BatchStore, owner: str, max_in_flight: int) -> None:
    """Refuse a new batch while the key has `max_in_flight` batches not yet finished (0: no quota)."""
    if not max_in_flight:
        return
    states, _ = await batches.listing(owner, after=None, limit=_ALL)
    num_active = sum(1 for state in states if state.status in ACTIVE)
    if num_active >= max_in_flight:
        raise OpenAIError(
            429,
            f"this API key has {num_active} batches in flight, its quota (GATEWAY_MAX_BATCHES_PER_KEY "
            f"{max_in_flight}); wait for one to finish, or cancel one (POST /v1/batches/{{id}}/cancel)",
            code="batch_quota_exceeded",
        )
