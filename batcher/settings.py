"""Batcher settings, from BATCHER_* environment variables (REDIS_URL without prefix)."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.logging_setup import LogFormat
from common.settings import (
    cell_field,
    log_format_field,
    redis_cluster_field,
    redis_url_field,
    retention_field,
)
from common.speculative_config import SpeculativeConfig, speculative_config_field


def _default_batcher_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class BatcherSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BATCHER_", extra="ignore")

    redis_url: str = redis_url_field()
    redis_cluster: bool = redis_cluster_field()
    cell: str = cell_field()
    log_format: LogFormat = log_format_field()
    retention_s: int = retention_field()
    # Each worker registers its own limits (WORKER_MAX_NUM_SEQS, ...); these only cap them.
    max_num_seqs: int | None = Field(
        None, ge=1, description="Cap on the requests in one worker's batch; default: the worker's own."
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="Cap on the token budget of one step (prefill chunks plus decodes); default: the "
        "worker's own.",
    )
    max_num_encoder_input_tokens: int | None = Field(
        None,
        ge=1,
        description="Image embeddings one step may encode (vLLM's name); default: the step's token budget.",
    )
    scheduling_policy: Literal["fused", "tgi"] = Field(
        "fused",
        description="fused: decodes and chunked prefills share each step (vLLM); "
        "tgi: whole prompts in prefill-only steps admitted by waiting_served_ratio (TGI).",
    )
    waiting_served_ratio: float = Field(
        0.3, ge=0, description="tgi: admit new requests only if floor(running * ratio) of them fit."
    )
    max_waiting_tokens: int = Field(
        20, ge=1, description="tgi: ...unless the running batch decoded this many steps without admitting."
    )
    async_scheduling: bool = Field(
        False, description="Send a worker's step N+1 while step N runs, so it never waits on the batcher."
    )
    async_plan_lead: float = Field(
        0.2,
        gt=0,
        le=1,
        description="With async scheduling, plan a worker's next step this fraction of a step before the "
        "running one is expected to end, so requests arriving meanwhile join it; 1 plans it at once.",
    )
    enable_prefix_caching: bool = Field(
        True,
        description="Reuse the KV of a prompt's cached prefix (full blocks) instead of computing it again.",
    )
    # Placement (batcher/core/placement.py): 0 places by load (free blocks) alone.
    cache_overlap_weight: float = Field(
        1.0, ge=0, description="A block still to prefill on a worker weighs this many blocks of its load."
    )
    prefix_wait: bool = Field(
        True,
        description="A waiting request whose prefix a running request is still prefilling waits (boundedly) "
        "for those blocks instead of computing them again; later requests pass it meanwhile.",
    )
    waiting_order: Literal["fcfs", "lpm"] = Field(
        "fcfs",
        description="fcfs: waiting requests are taken in arrival order (vLLM); lpm: the ones with the "
        "longest prefix cached on the worker first (SGLang), for a lower mean time to first token "
        "when hits queue behind uncached prompts; an uncached prompt then waits while hits keep coming.",
    )
    speculative_config: SpeculativeConfig | None = speculative_config_field()
    heartbeat_timeout_s: float = Field(
        5.0, gt=0, description="A worker whose last heartbeat is older than this is dead."
    )
    max_deliveries: int = Field(
        3,
        ge=1,
        description="A request that fails alone on this many deliveries to a worker goes to the "
        "dead-letter stream and its client gets an error.",
    )
    worker_check_interval_s: float = Field(
        0.5, gt=0, description="How often to look for new or dead workers."
    )
    lease_ttl_s: float = Field(
        5.0,
        gt=0,
        description="The active batcher's lease lives this long unless renewed (every third of it); "
        "a standby takes over within about this long after the active one dies.",
    )
    standby_poll_s: float = Field(
        0.5, gt=0, description="How often a standby batcher tries to take the lease."
    )
    trace_maxlen: int = Field(
        2000,
        ge=0,
        description="Steps kept in llm:batcher:trace for the dashboard (approximate MAXLEN); 0: no trace.",
    )
    batcher_id: str = Field(default_factory=_default_batcher_id, description="Consumer name in the group.")

    @model_validator(mode="after")
    def _check(self) -> BatcherSettings:
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        if tokens is not None and seqs is not None and tokens < seqs:
            raise ValueError(
                "BATCHER_MAX_NUM_BATCHED_TOKENS must be at least BATCHER_MAX_NUM_SEQS, "
                "or a full batch of decodes could not fit in one step"
            )
        spec = self.speculative_config
        if spec is not None and spec.method == "draft_model" and self.async_scheduling:
            # Model-free drafts are proposed once a request's step is back (policies/running.py); the
            # draft model's, made a step ahead by the worker, are not built for two steps in flight.
            raise ValueError(
                'SPECULATIVE_CONFIG "draft_model" does not work with BATCHER_ASYNC_SCHEDULING yet; '
                "unset one of them"
            )
        return self
