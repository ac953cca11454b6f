"""Pieces shared by every service's settings class (each service owns its own class and env prefix)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field

from common.streams import DEFAULT_CELL

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# The default retention window (CBSERVE_RETENTION_S): a finished request's token stream and keys stay
# this long (the resume window), and stream entries are trimmed by this age (MINID), never by a
# small MAXLEN. docs/reliability.md (*Retention*) lists every key and how it goes.
# Here, not in redis_conn.py: every service's settings read it, and the worker's model runner must
# not import Redis through them.
RETENTION_S = 15 * 60


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


def redis_cluster_field() -> Any:
    """`REDIS_CLUSTER`, read without the service's prefix, like REDIS_URL."""
    return Field(
        default=False,
        validation_alias=AliasChoices("REDIS_CLUSTER", "redis_cluster"),
        description="REDIS_URL names Redis Cluster nodes (redis://host:port,host:port/0): talk to the "
        "cluster through redis-py's RedisCluster.",
    )


def cell_field() -> Any:
    """`CBSERVE_CELL`, read without the service's prefix: the cell a service belongs to."""
    return Field(
        default=DEFAULT_CELL,
        validation_alias=AliasChoices("CBSERVE_CELL", "cell"),
        pattern=r"^[a-z0-9][a-z0-9-]{0,31}$",
        description="The cell (one batcher, its standbys and its workers) whose keys a service uses; "
        "the gateway and Celery clients place their requests in it.",
    )
