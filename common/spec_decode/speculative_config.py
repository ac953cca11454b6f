"""`SPECULATIVE_CONFIG`: how a deployment drafts tokens, in the shape of vLLM's --speculative-config.

A JSON object such as `{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
"prompt_lookup_max": 4}`, `{"method": "suffix"}` or `{"method": "draft_model", "model": DIR,
"num_speculative_tokens": 4}`. Every other method vLLM knows is refused here by name, so a deployment
asking for one fails at start-up instead of running without it.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

# vLLM's methods that are not built yet, and what to use meanwhile.
NOT_BUILT = ("eagle", "eagle3", "medusa", "mlp_speculator", "mtp")
BUILT = ("ngram", "suffix", "draft_model")


class SpeculativeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str = Field(
        description="How drafts are made: ngram (prompt lookup over prompt + output), suffix (the "
        "longest match in prompt + output or in recent requests), or draft_model (a small model with the "
        "target's tokenizer, run by each worker)."
    )
    model: str | None = Field(None, description="draft_model: the draft model's directory.")
    num_speculative_tokens: int | None = Field(
        None, ge=1, le=64, description="Tokens drafted per request per step (suffix: max_tree_depth)."
    )
    prompt_lookup_min: int = Field(1, ge=1, description="ngram: shortest suffix looked up.")
    prompt_lookup_max: int = Field(4, ge=1, description="ngram: longest suffix looked up.")
    # Suffix decoding, vLLM's names.
    suffix_decoding_max_tree_depth: int = Field(24, ge=2, description="suffix: longest match looked for.")
    suffix_decoding_max_cached_requests: int = Field(
        1000, ge=0, description="suffix: finished requests whose tokens are searched (0: the request's own)."
    )
    suffix_decoding_max_spec_factor: float = Field(
        1.0, gt=0, description="suffix: draft at most this many tokens per token matched."
    )
    # vLLM's name (unset there). A large batch already reads the weights for many tokens a step:
    # drafts then cost more compute than the steps they save, even accepted (docs/benchmarks.md).
    disable_by_batch_size: int | None = Field(
        8, ge=1, description="No drafts in a step of a worker running at least this many requests."
    )
    # Not vLLM's. A step with k drafts costs ~1 + 0.06k plain steps at batch 1 here (docs/benchmarks.md:
    # 4 drafts, 1.25x), more at larger batches: drafts pay above ~0.06-0.15 accepted per draft.
    disable_by_acceptance_rate: float | None = Field(
        0.15,
        ge=0,
        le=1,
        description="No drafts on a worker whose recent drafts were accepted below this rate (accepted / "
        "drafted); it drafts one request every few steps to notice when they pay again. null: never.",
    )

    @field_validator("method")
    @classmethod
    def _known(cls, method: str) -> str:
        if method in NOT_BUILT:
            raise ValueError(
                f'speculative method {method!r} is not supported yet; use "ngram", "suffix" or '
                '"draft_model", or unset SPECULATIVE_CONFIG'
            )
        if method not in BUILT:
            raise ValueError(
                f'unknown speculative method {method!r}; supported: "ngram", "suffix", "draft_model"'
            )
        return method

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must not exceed prompt_lookup_max")
        if self.method in ("ngram", "draft_model") and self.num_speculative_tokens is None:
            raise ValueError(f'"{self.method}" needs num_speculative_tokens')
        if (self.method == "draft_model") != (self.model is not None):
            raise ValueError('"model" (the draft model\'s directory) goes with "draft_model", and only there')
        return self

    @property
    def num_draft_tokens(self) -> int:
        """Most drafts per request per step (vLLM: suffix drafts up to its tree depth unless told)."""
        return self.num_speculative_tokens or self.suffix_decoding_max_tree_depth


def speculative_config_field() -> Any:
    """`SPECULATIVE_CONFIG`, read without the service's prefix: the same JSON for every service."""
    return Field(
        default=None,
        validation_alias=AliasChoices("SPECULATIVE_CONFIG", "speculative_config"),
        description="Speculative decoding as vLLM's --speculative-config JSON, e.g. "
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}; unset: off.',
    )
