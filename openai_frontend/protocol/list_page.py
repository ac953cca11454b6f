"""OpenAI's cursor-paged list object, as the Files and Batch APIs answer a listing."""

from __future__ import annotations

from typing import Any


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """One page of objects (each with its `id`); the next page starts `after` its `last_id`."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
