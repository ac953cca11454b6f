"""Gateway settings from `GATEWAY_*` env vars (plus `MODEL` and `REDIS_URL`); built only in `__main__`."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.logging_setup import LogFormat
from common.settings import log_format_field, redis_url_field


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore")

    # Model directory holding tokenizer.json (+ tokenizer_config.json, config.json, generation_config.json).
    model: Path = Field(validation_alias=AliasChoices("GATEWAY_MODEL", "MODEL", "model"))
    # Name clients pass as `model`; defaults to the model directory's name.
    served_model_name: str | None = None
    # Longest prompt + output; defaults to config.json's max_position_embeddings.
    max_model_len: int | None = Field(default=None, gt=0)
    # A worker counts as alive while its last heartbeat is younger than this.
    heartbeat_timeout_s: float = Field(default=5.0, gt=0)
    # Give up on a request (and abort it) when it has not finished after this long.
    request_timeout_s: float = Field(default=3600.0, gt=0)
    redis_url: str = redis_url_field()
    log_format: LogFormat = log_format_field()

    @field_validator("model")
    @classmethod
    def _model_has_tokenizer(cls, value: Path) -> Path:
        if not (value / "tokenizer.json").is_file():
            raise ValueError(
                f"GATEWAY_MODEL (or MODEL, --model) must be a model directory containing tokenizer.json; "
                f"{value} has none"
            )
        return value

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.resolve().name
