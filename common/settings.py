"""Pieces shared by every service's settings class (each service owns its own class and env prefix)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field

from common.redis_conn import RETENTION_S

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_url_field() -> Any:
    """`REDIS_URL`, read without the service's prefix so one variable configures every service."""
    return Field(
        default=DEFAULT_REDIS_URL,
        validation_alias=AliasChoices("REDIS_URL", "redis_url"),
        description="Redis connection URL (redis:// or rediss://, credentials allowed).",
    )


def log_format_field() -> Any:
    """`LOG_FORMAT` (text or json), read without the service's prefix, like REDIS_URL."""
    return Field(
        default="text",
        validation_alias=AliasChoices("LOG_FORMAT", "log_format"),
        description="text: lines for people; json: one JSON object per line for log pipelines.",
    )


def retention_field() -> Any:
    """`CBSERVE_RETENTION_S`, shared by every service: the resume window and the age streams keep."""
    return Field(
        default=RETENTION_S,
        gt=0,
        validation_alias=AliasChoices("CBSERVE_RETENTION_S", "retention_s"),
        description="Seconds a finished request's token stream and keys stay readable (the resume "
        "window), and the age past which stream entries are trimmed.",
    )
