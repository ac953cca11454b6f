"""The OpenAI Files API: POST /v1/files (multipart `file` + `purpose`), list, get, content, delete.

Files are kept in Redis (openai_frontend/batch/files_store.py), at most GATEWAY_MAX_FILE_BYTES each,
and only the API key that uploaded a file can see it: any other gets 404, as for an unknown id. Each
key stores at most GATEWAY_MAX_FILES_PER_KEY files of GATEWAY_MAX_FILE_BYTES_PER_KEY bytes together
(gateway/security/quotas.py).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from starlette.requests import Request
from starlette.responses import Response

from gateway.app_state import GatewayState, State
from gateway.security.auth import request_owner
from gateway.security.quotas import check_file_quota
from openai_frontend.batch.files_store import FileObject
from openai_frontend.protocol.errors import OpenAIError, invalid_request
from openai_frontend.protocol.list_page import list_page
from openai_frontend.protocol.strings import MAX_FILENAME_CHARS, MAX_WORD_CHARS, check_length

router = APIRouter()

# Uploads are for the Batch API; output files are written by batches themselves.
UPLOAD_PURPOSES = ("batch",)


def file_not_found(file_id: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(404, f"No such File object: {file_id}", param=param, code="file_not_found")


def check_upload(content: bytes, purpose: str, state: GatewayState) -> None:
    """What a batch input file must be before it is stored; the lines themselves are checked later."""
    if purpose not in UPLOAD_PURPOSES:
        raise invalid_request(
            f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}, got {purpose!r}", "purpose"
        )
    limit = state.settings.max_file_bytes
    if len(content) > limit:
        raise OpenAIError(413, f"the file is larger than {limit} bytes", param="file", code="file_too_large")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_request("the file must be UTF-8 encoded JSONL", "file", "invalid_file_format") from None
    num_lines = sum(1 for line in text.splitlines() if line.strip())
    if num_lines == 0:
        raise invalid_request("the file is empty", "file", "empty_file")
    if num_lines > state.settings.batch_max_requests:
        raise invalid_request(
            f"the file has {num_lines} requests; a batch holds at most {state.settings.batch_max_requests}",
            "file",
            "too_many_requests",
        )


@router.post("/v1/files", response_model=FileObject)
async def upload_file(
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form(max_length=MAX_WORD_CHARS)],
    http_request: Request,
    state: State,
) -> dict[str, Any]:
    filename = check_length(file.filename or "upload.jsonl", MAX_FILENAME_CHARS, "file")  # stored, listed
    content = await file.read()
    check_upload(content, purpose, state)
    owner = request_owner(http_request)
    limits = state.settings
    await check_file_quota(
        state.files, owner, len(content), limits.max_files_per_key, limits.max_file_bytes_per_key
    )
    expires_at = int(time.time()) + state.settings.file_expires_s
    meta = await state.files.put(owner, filename, purpose, content, expires_at=expires_at)
    return FileObject.of(meta).model_dump()


@router.get("/v1/files")
async def list_files(
    http_request: Request,
    state: State,
    purpose: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
) -> dict[str, Any]:
    metas, has_more = await state.files.listing(
        request_owner(http_request), purpose=purpose, after=after, limit=limit, newest_first=order == "desc"
    )
    return list_page([FileObject.of(m).model_dump() for m in metas], has_more)


@router.get("/v1/files/{file_id}", response_model=FileObject)
async def retrieve_file(file_id: str, http_request: Request, state: State) -> dict[str, Any]:
    meta = await state.files.get(request_owner(http_request), file_id)
    if meta is None:
        raise file_not_found(file_id)
    return FileObject.of(meta).model_dump()


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, http_request: Request, state: State) -> Response:
    content = await state.files.content(request_owner(http_request), file_id)
    if content is None:
        raise file_not_found(file_id)
    return Response(content, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, http_request: Request, state: State) -> dict[str, Any]:
    if not await state.files.delete(request_owner(http_request), file_id):
        raise file_not_found(file_id)
    return {"id": file_id, "object": "file", "deleted": True}
