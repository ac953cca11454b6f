"""vLLM's pooling methods of `LLM` (`LLM(model, runner="pooling")`): `embed`, `classify`, `score` and
`encode`, run as pooling requests through the same scheduler and runner as the served pipeline.

`score` pairs a text with others as vLLM does: a cross-encoder (or a decoder reranker) reads each pair
as its tokenizer encodes a pair; an embedding model embeds both texts and gives their cosine.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec

from cbserve.offline.engine import LLMEngine
from cbserve.offline.pooling_outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from cbserve.offline.prompts import PromptType, generate_prompts
from common.protocol import PoolingEvent, PoolingParams, PoolingTask, WorkerEvent
from openai_frontend.model.served_model import ServedModel
from openai_frontend.pooling.inputs import EmbeddingTokenizer
from openai_frontend.pooling.pairs import PairTokenizer, cosine, score_pairs

# vLLM's hf_overrides keys that configure a pooling model here; a Qwen3-Reranker's own two need
# nothing more than classifier_from_token.
_HF_OVERRIDES = {"classifier_from_token", "is_matryoshka", "architectures", "is_original_qwen3_reranker"}
_POOLER_CONFIG = {"pooling_type": "pooling_type", "normalize": "pooling_normalize"}

Inputs = list[tuple[list[int], list[int] | None]]  # per request: token ids, token type ids


def pooling_options(
    runner: str, convert: str, hf_overrides: Mapping[str, Any] | None, pooler_config: Mapping[str, Any] | None
) -> dict[str, Any]:
    """`LLM`'s pooling arguments (vLLM's names) as the worker's settings (gpu_worker/pooling_settings.py)."""
    options: dict[str, Any] = {"runner": runner, "convert": convert}
    extra = sorted(set(hf_overrides or {}) - _HF_OVERRIDES)
    if extra:
        raise ValueError(f"hf_overrides {extra} are not supported: only {sorted(_HF_OVERRIDES)}")
    for key in ("classifier_from_token", "is_matryoshka"):
        options[key] = (hf_overrides or {}).get(key)
    for key, value in (pooler_config or {}).items():
        if key not in _POOLER_CONFIG:
            raise ValueError(f"pooler_config {key!r} is not supported: only {sorted(_POOLER_CONFIG)}")
        options[_POOLER_CONFIG[key]] = value.lower() if isinstance(value, str) else value
    return options


class PoolingState:
    """One pooling request's result, once its event arrives."""

    def __init__(self, request_id: str, token_ids: list[int]) -> None:
        self.request_id = request_id
        self.token_ids = token_ids
        self.event: PoolingEvent | None = None
        self.stop_string_hit = False  # never: nothing is generated

    def on_event(self, event: WorkerEvent) -> bool:
        if self.event is not None or not isinstance(event, PoolingEvent):
            return False
        self.event = event
        return True

    def output(self, outputs: Any) -> PoolingRequestOutput[Any]:
        assert self.event is not None
        return PoolingRequestOutput(
            self.request_id, outputs, self.token_ids, num_cached_tokens=self.event.num_cached_tokens
        )


class EventSink(Protocol):
    request_id: str
    stop_string_hit: bool

    def on_event(self, event: WorkerEvent) -> bool: ...


class PoolingAPI:
    """Mixed into `LLM`, which provides these:"""

    llm_engine: LLMEngine
    _served: ServedModel
    _embedding_tokenizer: EmbeddingTokenizer
    _pair_tokenizer: PairTokenizer
    _request_counter: itertools.count[int]

    def _run_engine(self, states: Mapping[str, EventSink], use_tqdm: bool) -> None:
        raise NotImplementedError

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        truncate_prompt_tokens: int | None = None,
        pooling_params: PoolingParams | None = None,
        use_tqdm: bool = True,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (text or token ids, as `generate` takes them)."""
        params = self._params("embed", pooling_params, truncate_prompt_tokens)
        states = self._pool(self._embedding_inputs(prompts), params, use_tqdm)
        return [s.output(EmbeddingOutput(_values(s))) for s in states]

    def classify(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        truncate_prompt_tokens: int | None = None,
        pooling_params: PoolingParams | None = None,
        use_tqdm: bool = True,
    ) -> list[ClassificationRequestOutput]:
        """A classifier's class probabilities per prompt."""
        params = self._params("classify", pooling_params, truncate_prompt_tokens)
        states = self._pool(self._prompt_inputs(prompts), params, use_tqdm)
        return [s.output(ClassificationOutput(_values(s))) for s in states]

    def encode(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | None = None,
        *,
        pooling_task: PoolingTask = "embed",
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
    ) -> list[PoolingRequestOutput[PoolingOutput]]:
        """The values of any pooling task, as the worker sends them."""
        params = self._params(pooling_task, pooling_params, truncate_prompt_tokens)
        states = self._pool(self._prompt_inputs(prompts), params, use_tqdm)
        return [s.output(PoolingOutput(_values(s))) for s in states]

    def score(
        self,
        data_1: str | Sequence[str],
        data_2: str | Sequence[str],
        *,
        truncate_prompt_tokens: int | None = None,
        pooling_params: PoolingParams | None = None,
        use_tqdm: bool = True,
    ) -> list[ScoringRequestOutput]:
        """vLLM's `score`: `data_1` (one text, or a list) against `data_2`'s texts, one score each."""
        pairs = score_pairs(data_1, data_2)
        if "score" in self.llm_engine.info.pooling_tasks:
            params = self._params("score", pooling_params, truncate_prompt_tokens)
            inputs: Inputs = [self._pair_tokenizer.encode(a, b) for a, b in pairs]
            states = self._pool(inputs, params, use_tqdm)
            return [s.output(ScoringOutput(_values(s)[0])) for s in states]
        params = self._params("embed", pooling_params, truncate_prompt_tokens)
        texts = [text for pair in pairs for text in pair]
        states = self._pool(self._embedding_inputs(texts), params, use_tqdm)
        outputs = []
        for first, second in zip(states[::2], states[1::2], strict=True):
            out = first.output(ScoringOutput(cosine(_values(first), _values(second))))
            out.prompt_token_ids = first.token_ids + second.token_ids
            outputs.append(out)
        return outputs

    def _params(self, task: PoolingTask, given: PoolingParams | None, truncate: int | None) -> PoolingParams:
        info = self.llm_engine.info
        if task not in info.pooling_tasks:
            served = ", ".join(info.pooling_tasks) or "generation (runner generate)"
            raise ValueError(f"model {info.model!r} serves {served}, not {task}")
        params = PoolingParams(task=task) if given is None else given
        if params.task != task:
            raise ValueError(f"pooling_params.task is {params.task!r}, this call is {task!r}")
        if truncate is not None:
            params = msgspec.structs.replace(params, truncate_prompt_tokens=truncate)
        return params

    def _prompt_inputs(self, prompts: PromptType | Sequence[PromptType]) -> Inputs:
        return [(prompt.token_ids, None) for prompt in generate_prompts(prompts, self._served)]

    def _embedding_inputs(self, prompts: PromptType | Sequence[PromptType]) -> Inputs:
        """Texts tokenized as sentence-transformers tokenizes them for this model; the rest as
        `generate` takes them."""
        if self._embedding_tokenizer.message_format is None:
            return self._prompt_inputs(prompts)
        listed: Sequence[PromptType] = [prompts] if isinstance(prompts, str) else prompts  # type: ignore[assignment]
        if listed and isinstance(listed[0], int):
            listed = [prompts]  # type: ignore[list-item]
        return [
            (self._embedding_tokenizer.encode(p), None) if isinstance(p, str) else self._prompt_inputs(p)[0]
            for p in listed
        ]

    def _pool(self, inputs: Inputs, params: PoolingParams, use_tqdm: bool) -> list[PoolingState]:
        states = [PoolingState(str(next(self._request_counter)), ids) for ids, _ in inputs]
        for state, (ids, token_types) in zip(states, inputs, strict=True):
            self.llm_engine.add_pooling_request(state.request_id, ids, params, token_types)
        self._run_engine({state.request_id: state for state in states}, use_tqdm)
        return states


def _values(state: PoolingState) -> list[float]:
    assert state.event is not None
    return state.event.values()
