"""The worker's pooling settings (vLLM's `--runner`, `--convert`, `--pooler-config` and the
`classifier_from_token` override), a part of `WorkerSettings` (settings.py) read from the same
`WORKER_*` variables. gpu_worker/runner/pooling/model_files.py reads what is left on auto from the
model's own files."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

RunnerSetting = Literal["auto", "generate", "pooling"]
ConvertSetting = Literal["auto", "embed", "classify"]
PoolingTypeSetting = Literal["auto", "last", "mean", "cls"]


class PoolingSettings(BaseSettings):
    runner: RunnerSetting = Field(
        default="auto",
        description="vLLM's --runner: generate (sample tokens) or pooling (embeddings, classification, "
        "scores; the worker then answers pooling requests only). auto: pooling for a "
        "sentence-transformers model (modules.json), an encoder (BERT, RoBERTa, XLM-RoBERTa, "
        "ModernBERT...), a *ForSequenceClassification or a headless *Model, or when "
        "classifier_from_token is set; generate otherwise.",
    )
    convert: ConvertSetting = Field(
        default="auto",
        description="vLLM's --convert: what a causal LM serves under the pooling runner: embed (a pooled "
        "hidden state) or classify (a classifier head: the model's own, or classifier_from_token's). "
        "auto: classify for *ForSequenceClassification or with classifier_from_token, embed otherwise. "
        "Set, it implies runner pooling: embed serves a chat model's own last-token hidden states.",
    )
    pooling_type: PoolingTypeSetting = Field(
        default="auto",
        description="How an embedding pools the hidden states (vLLM's pooler_config.pooling_type): last "
        "token, mean, or cls (the first token). auto: the sentence-transformers Pooling module's mode "
        "(1_Pooling/config.json), else last for a causal LM and cls for an encoder, as vLLM does.",
    )
    pooling_normalize: bool | None = Field(
        default=None,
        description="L2-normalize embeddings unless a request says otherwise. Default: as the model's files "
        "say (a sentence-transformers model with a Normalize module), else true as in vLLM.",
    )
    classifier_from_token: list[str] | None = Field(
        default=None,
        description='A decoder reranker scoring with the logits of two tokens (Qwen3-Reranker: \'["no", '
        "\"yes\"]'; vLLM's classifier_from_token): score = softmax over the two, the second one's "
        "probability.",
    )
    is_matryoshka: bool | None = Field(
        default=None,
        description="Whether embeddings may be cut to a request's `dimensions` (vLLM's is_matryoshka). "
        "Default: the model config's is_matryoshka or matryoshka_dimensions.",
    )

    @field_validator("classifier_from_token", mode="after")
    @classmethod
    def _two_tokens(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(value) != 2:
            raise ValueError(
                f"classifier_from_token takes two tokens (the 'no' and the 'yes' one), not {len(value)}"
            )
        return value
