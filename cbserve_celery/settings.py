"""Celery worker settings from `CBSERVE_CELERY_*` env vars (plus `REDIS_URL`, `MODEL`, `LOG_FORMAT`).

Not `CELERY_*`: the `celery` command reads that prefix for its own options.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.logging_setup import LogFormat
from common.models_config import ModelsConfig, load_models_config
from common.settings import cell_field, log_format_field, redis_cluster_field, redis_url_field


class CelerySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CBSERVE_CELERY_", extra="ignore")

    # cbserve's Redis, also the broker and the result backend.
    redis_url: str = redis_url_field()
    redis_cluster: bool = redis_cluster_field()
    cell: str = cell_field()
    # Model directory with tokenizer.json, for text prompts and text results; without it, token ids only.
    model: Path | None = Field(
        default=None, validation_alias=AliasChoices("CBSERVE_CELERY_MODEL", "MODEL", "model")
    )
    # The gateway's GATEWAY_MODELS_CONFIG, for a gateway of several models: a tokenizer per model, for
    # batch lines naming any of them (instead of `model`).
    models_config: Path | None = None
    # A task gives up on its request (and aborts it) after this long.
    request_timeout_s: float = Field(default=1800.0, gt=0)
    # The Redis broker hands a task back to the queue once it has been unacknowledged this long. The
    # worker moves the delivery time of every task it holds to now every quarter of it
    # (cbserve_celery/visibility.py), so a running task is never delivered again, and a dead worker's
    # task moves on to another worker about this long after the worker died.
    visibility_timeout_s: float = Field(default=45.0, ge=2.0)
    # Task results stay in Redis this long.
    result_expires_s: int = Field(default=24 * 3600, gt=0)
    log_format: LogFormat = log_format_field()

    # --- batches (cbserve.run_batch, see cbserve_celery/batch_run.py) ---------------------------
    # Lines of one batch generating at once; the others wait in the task, not in the batcher's queue.
    batch_max_lines_in_flight: int = Field(default=64, gt=0)
    # A task runs a batch for at most this long, then hands it to a fresh task (progress is kept, and
    # other batches get their turn).
    batch_slice_s: float = Field(default=300.0, gt=0)
    # The TTL of the running task's claim on its batch (cbserve_celery/batch_claim.py; renewed twice a
    # second): after a crash, the task delivered again takes the batch over once this has run out. The
    # name keeps its documented env var, CBSERVE_CELERY_BATCH_LEASE_TTL_S.
    batch_lease_ttl_s: float = Field(default=30.0, ge=2.0)
    # A task whose run Redis fails (down, restarting, refusing writes) runs it again with backoff, in
    # the same task (a retry through the broker needs the broker), for up to this long from the first
    # failure; then it ends and the reaper queues the batch again once Redis answers.
    batch_redis_wait_s: float = Field(default=300.0, gt=0)
    # How often one of the workers looks for active batches that no task holds, queued or running
    # (cbserve_celery/batch_reaper.py); one found on two looks in a row is queued again.
    batch_reap_interval_s: float = Field(default=60.0, ge=0.5)

    @property
    def visibility_heartbeat_s(self) -> float:
        """How often the worker refreshes the deliveries it holds (cbserve_celery/visibility.py)."""
        return self.visibility_timeout_s / 4

    @model_validator(mode="after")
    def _check_model(self) -> CelerySettings:
        if self.model is not None and not (self.model / "tokenizer.json").is_file():
            raise ValueError(f"CBSERVE_CELERY_MODEL (or MODEL) {self.model} holds no tokenizer.json")
        if self.models_config is not None:
            if self.model is not None:
                raise ValueError(
                    "CBSERVE_CELERY_MODELS_CONFIG names every model: leave CBSERVE_CELERY_MODEL (MODEL) unset"
                )
            for m in load_models_config(self.models_config).models:
                if not (m.model / "tokenizer.json").is_file():
                    raise ValueError(
                        f"CBSERVE_CELERY_MODELS_CONFIG's model {m.name!r}: {m.model} holds no tokenizer.json"
                    )
        return self

    @property
    def models_file(self) -> ModelsConfig | None:
        return None if self.models_config is None else load_models_config(self.models_config)
