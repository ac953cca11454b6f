"""The batcher's state for one request."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from common.finish import max_samples, num_samples_left
from common.protocol import (
    FinishReason,
    GenerateRequest,
    LoRARequest,
    MultiModalFeature,
    NewRequestData,
    PoolingParams,
    SamplingParams,
)

# What the scheduler plans a pooling request with: its prompt, then one step that only ends it.
POOLING_SAMPLING = SamplingParams(max_tokens=0)


def truncated_prompt(msg: GenerateRequest) -> tuple[list[int], list[int] | None]:
    """The prompt (and token types) a request runs: a pooling request's `truncate_prompt_tokens` k > 0
    keeps its last k tokens, as vLLM does with token ids (-1, the model's length: pooling.py)."""
    prompt, token_types = list(msg.prompt_token_ids), msg.token_type_ids
    k = None if msg.pooling_params is None else msg.pooling_params.truncate_prompt_tokens
    if k is not None and 0 < k < len(prompt):
        prompt = prompt[-k:]
        token_types = None if token_types is None else token_types[-k:]
    return prompt, token_types


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # never scheduled, or preempted / orphaned and waiting to be recomputed
    RUNNING = "running"  # holds blocks on a worker
    FINISHED = "finished"  # ended for `finish_reason`; freed


@dataclass(slots=True, eq=False)
class Request:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    entry_id: str  # its entry in the requests stream, acknowledged when it finishes
    priority: int = 0
    owner: str = ""
    queued_at: float = 0.0  # unix seconds when this batcher took it in (queue time starts here)
    queue_deadline: float | None = None  # unix seconds; failed if never scheduled by then
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    # Tokens whose KV the worker holds once the steps already sent are done (counted when scheduled).
    num_computed_tokens: int = 0
    # Tokens the steps already sent will sample but whose results have not arrived (async scheduling).
    num_output_placeholders: int = 0
    num_inflight_steps: int = 0  # steps sent with this request whose results have not arrived
    spec_token_ids: list[int] = field(default_factory=list)  # drafts of its step in flight (vLLM's name)
    num_spec_tokens: int = 0  # most drafts it proposes next (spec_decode/drafting.py); 0: the setting's
    draft_token_ids: list[int] = field(default_factory=list)  # its draft model's, for its next step
    # Known tokens when it was last admitted: computing any of them is prefill (a recompute included).
    num_prefill_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    # Prefix caching (kv/prefix_cache.py): hashes of its full blocks of known tokens, for block size
    # `hash_block_size`, and how many of its blocks from the start are findable in its worker's cache.
    block_hashes: list[bytes] = field(default_factory=list)
    hash_block_size: int = 0
    num_cached_blocks: int = 0
    num_prefix_waits: int = 0  # scheduling passes it was held for a prefix another request computes
    worker_id: str | None = None  # the worker holding its KV while RUNNING
    attempt: int = 0  # bumped on every (re)schedule; the worker stamps it on token events
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    error: str | None = None  # why it failed, when finish_reason is "error"
    num_failed_deliveries: int = 0  # times a worker reported it failed alone (not counting dead workers)
    dead_letter: bool = False  # given up after too many failed deliveries: copied to the dead-letter stream
    error_code: str = "server_error"  # the RequestError's code: what the client is told the cause is
    lora_request: LoRARequest | None = None  # the adapter it runs with; None: the base model
    pooling_params: PoolingParams | None = None  # a pooling request: its prompt is computed, nothing sampled
    token_type_ids: list[int] | None = None  # a cross-encoder pair's segments, one per prompt token
    # Its images (placeholder runs in the prompt, the processor's tensors): sent with it every time it
    # is scheduled anew, so whichever worker runs it encodes them again.
    mm_features: list[MultiModalFeature] | None = None

    @classmethod
    def from_message(cls, msg: GenerateRequest, entry_id: str) -> Request:
        prompt, token_types = truncated_prompt(msg)
        return cls(
            req_id=msg.req_id,
            prompt_token_ids=prompt,
            # A pooling request generates nothing: it ends where its prompt does, as max_tokens 0 does.
            sampling_params=msg.sampling_params if msg.pooling_params is None else POOLING_SAMPLING,
            arrival_time=msg.arrival_time,
            entry_id=entry_id,
            priority=msg.priority,
            owner=msg.owner,
            queue_deadline=msg.queue_deadline,
            lora_request=msg.lora_request,
            pooling_params=msg.pooling_params,
            token_type_ids=token_types,
            mm_features=msg.mm_features,
        )

    def to_message(self) -> GenerateRequest:
        """The request as it was submitted (for the dead-letter stream)."""
        return GenerateRequest(
            req_id=self.req_id,
            prompt_token_ids=self.prompt_token_ids,
            sampling_params=self.sampling_params,
            arrival_time=self.arrival_time,
            priority=self.priority,
            owner=self.owner,
            lora_request=self.lora_request,
            pooling_params=self.pooling_params,
            token_type_ids=self.token_type_ids,
            mm_features=self.mm_features,
        )

    @property
    def lora_key(self) -> bytes | None:
        """What names its adapter (LoRARequest.cache_key), None for the base model."""
        return None if self.lora_request is None else self.lora_request.cache_key

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the worker must have computed before it samples again."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_placeholders(self) -> int:
        """Known tokens plus those being sampled now: what the next step may compute up to."""
        return self.num_tokens + self.num_output_placeholders

    def is_finishing(self, max_model_len: int) -> bool:
        """Steps already sent will bring it to its length bound (common/finish.py) on a worker of
        `max_model_len`: scheduling it again would be wasted."""
        num_output = len(self.output_token_ids) + self.num_output_placeholders
        num_tokens = self.num_tokens_with_placeholders
        return num_samples_left(num_output, num_tokens, self.sampling_params, max_model_len) <= 0

    @property
    def max_num_tokens(self) -> int:
        """The longest this request can grow, whatever the model's context."""
        return len(self.prompt_token_ids) + max_samples(self.sampling_params)

    def to_new_request_data(self) -> NewRequestData:
        return NewRequestData(
            req_id=self.req_id,
            prompt_token_ids=self.prompt_token_ids,
            output_token_ids=list(self.output_token_ids),
            sampling_params=self.sampling_params,
            block_ids=list(self.block_ids),
            num_computed_tokens=self.num_computed_tokens,
            attempt=self.attempt,
            lora_request=self.lora_request,
            pooling_params=self.pooling_params,
            token_type_ids=self.token_type_ids,
            mm_features=self.mm_features,
        )
