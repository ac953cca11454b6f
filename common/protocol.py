"""Every message that crosses Redis, as msgspec Structs encoded with msgpack (never pickle).

Shapes follow vLLM v1's SchedulerOutput / ModelRunnerOutput: new requests travel to a worker in full
once, running ones only as a diff. Each Struct carries a tag so one stream can hold several kinds.
"""

from __future__ import annotations

import struct
from typing import Final, Literal

import msgspec

# Finish reasons use the OpenAI words; "abort" and "error" never reach a client as a normal finish.
FinishReason = Literal["stop", "length", "abort", "error"]

# Name of the single field that holds the encoded message in every stream entry.
FIELD: Final = b"m"


StructuredOutputKind = Literal["json", "json_object", "regex", "choice", "grammar"]


class StructuredOutput(msgspec.Struct, frozen=True, kw_only=True):
    """A grammar the output must follow, enforced by the worker as a token mask before sampling.

    `definition` by kind: json, a JSON schema (as JSON text); json_object, ignored (any JSON object);
    regex, a regular expression; choice, a JSON list of the strings allowed; grammar, EBNF (GBNF) text.
    """

    kind: StructuredOutputKind
    # Sent as `spec`, its first name, so that requests queued across an upgrade still decode.
    definition: str = msgspec.field(default="", name="spec")


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    max_tokens: int = 16  # tokens to generate at most
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass kept, 1.0 keeps all
    top_k: int = 0  # keep the k most likely tokens, 0 keeps all
    seed: int | None = None  # per-request seed: the sample at output index i depends only on (seed, i)
    stop_token_ids: list[int] = []  # extra token ids that end the request (the token is kept)
    ignore_eos: bool = False  # keep generating past EOS
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one, 0 keeps all
    presence_penalty: float = 0.0  # subtracted from the logit of every token already in the output
    frequency_penalty: float = 0.0  # subtracted once per occurrence in the output
    repetition_penalty: float = 1.0  # HF style over prompt + output: > 1 divides positive logits
    logit_bias: dict[int, float] = {}  # token id -> added to its logit before anything else
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens are out
    logprobs: int | None = None  # None: none; k: the sampled token's logprob and the k most likely
    # vLLM's name: None, none; k: each prompt token's logprob (the first has none) and the k most likely,
    # computed in the prefill's own forward (the request then computes its whole prompt, no cache).
    prompt_logprobs: int | None = None
    structured_output: StructuredOutput | None = None  # the grammar the output follows, if any

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


class LoRARequest(msgspec.Struct, frozen=True, kw_only=True):
    """vLLM's LoRARequest: the PEFT adapter a request runs with, read by the worker from `lora_path`
    (`adapter_config.json` + `adapter_model.safetensors`); the base model's weights stay as they are."""

    lora_name: str  # the name clients pass as `model`
    lora_path: str  # the adapter's directory, as every worker of its cells sees it

    @property
    def cache_key(self) -> bytes:
        """What keys its prefix-cache blocks: an adapter's KV is not the base model's, nor another's."""
        return b"lora\0" + self.lora_name.encode() + b"\0" + self.lora_path.encode()


PoolingTask = Literal["embed", "classify", "score"]


class PoolingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """vLLM's PoolingParams: the request runs its prompt through a pooling model (a worker whose
    `runner` is "pooling") and gets one vector back in a `PoolingEvent`, instead of sampling tokens."""

    task: PoolingTask = "embed"  # embed: the pooled hidden state; classify: class scores; score: a pair's
    dimensions: int | None = None  # Matryoshka models only: keep the first values, then normalize
    normalize: bool | None = None  # embed: L2-normalize the vector; None: as the model's files say
    # classify / score: apply the model's activation (sigmoid, softmax, ...) to the logits; None: yes.
    activation: bool | None = None
    # Keep only the last k prompt tokens (-1: the model's length); a longer prompt is refused otherwise.
    truncate_prompt_tokens: int | None = None


class TensorData(msgspec.Struct, frozen=True, kw_only=True):
    """A tensor on the wire: its raw bytes (little-endian, C order), dtype name and shape."""

    dtype: str  # torch's name without the prefix: "float32", "int64", ...
    shape: list[int]
    data: bytes


class PlaceholderRange(msgspec.Struct, frozen=True, kw_only=True):
    """vLLM's PlaceholderRange: where an image's embeddings go in the prompt."""

    offset: int  # index in prompt_token_ids of its first placeholder token
    length: int  # placeholder tokens it fills, one embedding each


class MultiModalFeature(msgspec.Struct, frozen=True, kw_only=True):
    """vLLM's MultiModalFeatureSpec: one image of a request as the model's own processor made it (in
    the gateway); the worker runs the vision encoder on `data` and puts its output at `mm_position`."""

    modality: Literal["image"] = "image"
    # Content hash (hex) of the processed inputs: keys the worker's encoder cache and the prefix-cache
    # blocks its placeholders fall in (the same text with another image is not a hit).
    identifier: str
    mm_position: PlaceholderRange
    data: dict[str, TensorData]  # the processor's outputs for this image: pixel_values, image_grid_thw, ...


class GenerateRequest(msgspec.Struct, tag="request", kw_only=True):
    """One entry on the requests stream: what any client (gateway, Celery, raw) submits."""

    req_id: str  # unguessable id; also names the request's token stream
    prompt_token_ids: list[int]  # already tokenized (chat template applied)
    sampling_params: SamplingParams
    arrival_time: float  # unix seconds when the client's request arrived
    priority: int = 0  # lower runs first: admitted earlier, preempted later (interactive 0, batch lines 1)
    owner: str = ""  # API key id that created it
    user: str = ""  # the client's end-user id (OpenAI `user`), recorded for abuse tracing
    # Unix seconds; still waiting for its first step after this, the batcher fails it (`queue_timeout`).
    queue_deadline: float | None = None
    lora_request: LoRARequest | None = None  # None: the base model
    pooling_params: PoolingParams | None = None  # None: generation; else a pooling request (no tokens)
    # Pooling requests of a cross-encoder (vLLM's TokensPrompt field): each prompt token's segment.
    token_type_ids: list[int] | None = None
    mm_features: list[MultiModalFeature] | None = None  # its images, in prompt order; None: text only


class AbortRequest(msgspec.Struct, tag="abort", kw_only=True):
    """To the batcher's inbox: stop this request (client gone, stop string hit)."""

    req_id: str
    reason: str = "abort"  # "abort" (client left) or "stop" (stop string matched in the gateway)


class WorkerInfo(msgspec.Struct, tag="hello", kw_only=True):
    """A worker announcing itself: to the inbox on start, and in the workers hash."""

    worker_id: str  # unique per process, names its steps stream
    model: str  # model path or hub id it serves
    num_blocks: int  # KV-cache blocks in its pool
    block_size: int  # tokens per block
    max_model_len: int  # longest sequence (prompt + output) it can hold
    started_at: float  # unix seconds
    # Its step limits (sized for its device); the defaults are what a worker without them was given.
    max_num_seqs: int = 64  # requests in one step
    max_num_batched_tokens: int = 512  # tokens computed in one step (prefill chunks + decodes)
    max_loras: int = 0  # distinct LoRA adapters one step may use; 0: it serves no adapters
    max_lora_rank: int = 0  # the highest adapter rank it takes
    max_cpu_loras: int = 0  # adapters it keeps in host memory (LRU), ready to move to a step's slots
    # vLLM's --runner: "generate" samples tokens; "pooling" answers pooling requests only.
    runner: Literal["generate", "pooling"] = "generate"
    pooling_tasks: list[PoolingTask] = []  # the tasks a pooling worker serves
    # False (bidirectional encoders): a prompt is computed whole in one step, never in chunks.
    chunked_prefill: bool = True
    # False (mean or CLS pooling): every prompt token's hidden state is needed, so no cached prefix is reused.
    prefix_caching: bool = True
    embed_dim: int = 0  # length of an "embed" vector (before Matryoshka truncation)
    is_matryoshka: bool = False  # embed vectors may be cut to `dimensions` (vLLM's name)
    matryoshka_dimensions: list[int] = []  # the sizes it was trained for; empty: any up to embed_dim
    supports_multimodal: bool = False  # a vision-language model: requests may carry images (vLLM's name)
    # Images attend bidirectionally within themselves (Gemma 3): an image's placeholder run is never
    # split across prefill chunks (vLLM's name).
    disable_chunked_mm_input: bool = False


class WorkerLost(msgspec.Struct, tag="worker_lost", kw_only=True):
    """Written by the batcher to its own inbox right after fencing a worker (see docs/architecture.md).

    The fence makes every later write of that worker fail, so every result it did write sits in the
    inbox before this marker: reading up to it, the batcher knows every token the worker streamed.
    """

    worker_id: str
    reason: str = "heartbeat timeout"


class NewRequestData(msgspec.Struct, kw_only=True):
    """A request scheduled on a worker for the first time (or again after preemption / failover)."""

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # tokens already generated and streamed; recomputed with the prompt
    sampling_params: SamplingParams
    block_ids: list[int]  # KV blocks allocated so far, in order
    num_computed_tokens: int  # tokens whose KV is already in those blocks (0 without prefix caching)
    attempt: int  # bumped on every (re)schedule; fences stale writers of the token stream
    lora_request: LoRARequest | None = None  # None: the base model
    pooling_params: PoolingParams | None = None  # set: pool its prompt, sample nothing
    token_type_ids: list[int] | None = None  # segments of a cross-encoder's pair
    mm_features: list[MultiModalFeature] | None = None  # its images; re-encoded by whichever worker runs it


class CachedRequestData(msgspec.Struct, kw_only=True):
    """A request the worker already holds: only what changed."""

    req_id: str
    new_block_ids: list[int]  # blocks appended to its block table this step
    num_computed_tokens: int  # as the batcher counts it before this step (the worker checks it)


class SchedulerOutput(msgspec.Struct, tag="step", kw_only=True):
    """One iteration for one worker: exactly one forward pass over these tokens."""

    step_id: int  # increases per worker; echoed in the result
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: list[CachedRequestData]
    num_scheduled_tokens: dict[str, int]  # req_id -> tokens to compute this step (prefill chunk or 1)
    total_num_scheduled_tokens: int
    finished_req_ids: list[str]  # finished, aborted or preempted since the last step: free them
    epoch: int = 0  # the sending batcher's lease epoch (batcher/service/leadership.py); echoed in the result
    # vLLM's name: req_id -> draft tokens computed after its known tokens (in num_scheduled_tokens).
    scheduled_spec_decode_tokens: dict[str, list[int]] = {}
    # req_id -> how many tokens the worker's draft model drafts after this step (method draft_model).
    draft_after: dict[str, int] = {}


class ModelRunnerOutput(msgspec.Struct, tag="result", kw_only=True):
    """A worker's answer to one SchedulerOutput, sent to the batcher's inbox."""

    step_id: int
    worker_id: str
    req_ids: list[str]  # requests that sampled a token (their prompt is fully computed)
    sampled_token_ids: list[int]  # one per req_id
    finish_reasons: list[FinishReason | None]  # decided from token ids: EOS, max_tokens, stop ids
    req_errors: dict[str, str] = {}  # req_id -> message for requests that failed alone
    num_scheduled_tokens: int = 0  # tokens this step computed
    # Seconds from its launch (or the end of the step before, if later) until its output was made.
    step_time: float = 0.0
    worker_idle_s: float = 0.0  # seconds between publishing the previous result and receiving this step
    overlapped: bool = False  # launched while the worker's previous step still ran on the device
    epoch: int = 0  # the epoch of the step it answers: a new batcher ignores results of an old one
    # req_id -> the drafts verified this step: its output grew by them, then by its sampled token.
    accepted_draft_token_ids: dict[str, list[int]] = {}
    # req_id -> the draft model's drafts after this step's tokens, for its next step (draft_after).
    draft_token_ids: dict[str, list[int]] = {}
    num_encoder_runs: int = 0  # images this step ran through the vision encoder
    num_encoder_cache_hits: int = 0  # images this step found in the worker's encoder cache


class TokenEvent(msgspec.Struct, tag="token", kw_only=True, omit_defaults=True):
    """One generated token on a request's token stream; its stream entry id is the SSE id.

    Logprob fields exist only when the request asked for logprobs (omitted from the encoding otherwise).
    """

    req_id: str
    index: int  # position in the output; readers drop indexes they already have
    token_id: int
    attempt: int  # readers drop events from an attempt older than the newest seen
    finish_reason: FinishReason | None = None  # set on the last token
    logprob: float | None = None  # log-probability of token_id under the model's raw distribution
    top_token_ids: list[int] = []  # the most likely tokens, most likely first
    top_logprobs: list[float] = []  # their log-probabilities, parallel to top_token_ids
    num_cached_tokens: int = 0  # on the first token: prompt tokens served from the prefix cache


class PromptEvent(msgspec.Struct, tag="prompt", kw_only=True, omit_defaults=True):
    """The prompt is computed: sent once per attempt, before the first token event, for a request
    that asked for prompt logprobs or generates nothing (max_tokens 0, then it carries the finish).

    Entry i is about prompt token i + 1 (the first prompt token has no logprob: nothing precedes it).
    """

    req_id: str
    attempt: int
    token_ids: list[int]  # the whole prompt, so that a reader needs nothing else to show it
    logprobs: list[float] = []  # of prompt tokens 1.. under the model's raw distribution
    top_token_ids: list[list[int]] = []  # per entry, the most likely tokens, most likely first
    top_logprobs: list[list[float]] = []  # their log-probabilities, parallel to top_token_ids
    finish_reason: FinishReason | None = None  # "length" when the request generates nothing
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (when it ends here)


class PoolingEvent(msgspec.Struct, tag="pooling", kw_only=True, omit_defaults=True):
    """A pooling request's result: the one and last entry of its token stream (per attempt)."""

    req_id: str
    attempt: int
    # Little-endian float32 values: the embedding (embed), the class scores (classify) or one score (score).
    data: bytes
    num_prompt_tokens: int  # tokens the model read (usage)
    num_cached_tokens: int = 0  # of which served from the prefix cache

    def values(self) -> list[float]:
        return list(struct.unpack(f"<{len(self.data) // 4}f", self.data))


class RequestError(msgspec.Struct, tag="error", kw_only=True):
    """Terminal event on a token stream: the request failed and produced no more tokens."""

    req_id: str
    message: str
    code: str = "server_error"  # OpenAI-style error code for the client


InboxMessage = ModelRunnerOutput | AbortRequest | WorkerInfo | WorkerLost
StreamEvent = TokenEvent | PromptEvent | PoolingEvent | RequestError
WorkerEvent = TokenEvent | PromptEvent | PoolingEvent  # what a worker writes to token streams


def ends_stream(event: WorkerEvent) -> bool:
    """The event is its request's last: a finish, or a pooling request's one result."""
    return isinstance(event, PoolingEvent) or event.finish_reason is not None


_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(GenerateRequest)
_inbox_decoder = msgspec.msgpack.Decoder(InboxMessage)
_step_decoder = msgspec.msgpack.Decoder(SchedulerOutput)
_event_decoder = msgspec.msgpack.Decoder(StreamEvent)
_worker_decoder = msgspec.msgpack.Decoder(WorkerInfo)


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode_request(data: bytes) -> GenerateRequest:
    return _request_decoder.decode(data)


def decode_inbox(data: bytes) -> InboxMessage:
    return _inbox_decoder.decode(data)


def decode_step(data: bytes) -> SchedulerOutput:
    return _step_decoder.decode(data)


def decode_event(data: bytes) -> StreamEvent:
    return _event_decoder.decode(data)


def decode_worker(data: bytes) -> WorkerInfo:
    return _worker_decoder.decode(data)
