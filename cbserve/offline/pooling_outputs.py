"""What `LLM.embed`, `LLM.classify`, `LLM.score` and `LLM.encode` return, in vLLM's shape and names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar


@dataclass(slots=True, frozen=True)
class PoolingOutput:
    data: list[float]  # the request's values as the worker sent them


@dataclass(slots=True, frozen=True)
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass(slots=True, frozen=True)
class ClassificationOutput:
    probs: list[float]  # one per class, through the classifier's activation

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass(slots=True, frozen=True)
class ScoringOutput:
    score: float


OutputT = TypeVar("OutputT", PoolingOutput, EmbeddingOutput, ClassificationOutput, ScoringOutput)


@dataclass(slots=True)
class PoolingRequestOutput(Generic[OutputT]):
    request_id: str
    outputs: OutputT
    prompt_token_ids: list[int]
    finished: bool = True
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache


EmbeddingRequestOutput = PoolingRequestOutput[EmbeddingOutput]
ClassificationRequestOutput = PoolingRequestOutput[ClassificationOutput]
ScoringRequestOutput = PoolingRequestOutput[ScoringOutput]
