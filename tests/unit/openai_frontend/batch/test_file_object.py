"""A stored file's meta as the OpenAI file object: its fields of the same names, never its owner."""

from __future__ import annotations

from openai_frontend.batch.files_store import FileMeta, FileObject


def test_the_file_object_shows_the_meta_but_its_owner() -> None:
    meta = FileMeta(
        id="file-1", bytes=3, created_at=10, expires_at=20, filename="a.jsonl", purpose="batch", owner="bob"
    )
    assert FileObject.of(meta).model_dump() == {
        "id": "file-1",
        "object": "file",
        "bytes": 3,
        "created_at": 10,
        "expires_at": 20,
        "filename": "a.jsonl",
        "purpose": "batch",
        "status": "processed",
        "status_details": None,
    }
