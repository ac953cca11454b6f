"""What the worker remembers about each request it holds between steps."""

from __future__ import annotations

from dataclasses import dataclass

from common.protocol import FinishReason, LoRARequest, NewRequestData, SamplingParams
from gpu_worker.runner.sample.prompt_logprobs import PromptLogprobs


@dataclass(slots=True)
class CachedRequestState:
    req_id: str
    token_ids: list[int]  # prompt followed by every output token, including ones from earlier attempts
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]  # block table: block i holds positions [i * block_size, (i + 1) * block_size)
    num_computed_tokens: int  # tokens whose KV is in the pool
    attempt: int  # echoed on token events so readers can fence stale writers
    finish_reason: FinishReason | None = None  # set once decided; the batcher frees it next step
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache when first scheduled (usage)
    # Collected while its prompt is computed, when it asked and has no output yet (a request
    # recomputed with output tokens has sent them already).
    prompt_logprobs: PromptLogprobs | None = None
    lora_request: LoRARequest | None = None  # the adapter it runs with; None: the base model

    @classmethod
    def from_new(cls, new: NewRequestData) -> CachedRequestState:
        k = new.sampling_params.prompt_logprobs
        return cls(
            req_id=new.req_id,
            token_ids=[*new.prompt_token_ids, *new.output_token_ids],
            num_prompt_tokens=len(new.prompt_token_ids),
            sampling_params=new.sampling_params,
            block_ids=list(new.block_ids),
            num_computed_tokens=new.num_computed_tokens,
            attempt=new.attempt,
            num_cached_tokens=0 if new.output_token_ids else new.num_computed_tokens,
            prompt_logprobs=None if k is None or new.output_token_ids else PromptLogprobs(k),
            lora_request=new.lora_request,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]
