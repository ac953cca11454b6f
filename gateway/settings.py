"""Gateway settings from `GATEWAY_*` env vars (plus `MODEL` and `REDIS_URL`); built only in `__main__`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.logging_setup import LogFormat
from common.models_config import ModelsConfig, load_models_config
from common.settings import (
    cell_field,
    log_format_field,
    redis_cluster_field,
    redis_url_field,
    retention_field,
)
from common.streams import check_cell
from gateway.cell_router import CellPolicy
from gateway.key_hashes import parse_key_hashes
from openai_frontend.media.rules import DEFAULT_MAX_IMAGE_PIXELS, MediaRules
from openai_frontend.protocol.strings import MAX_ID_CHARS


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore")

    # Model directory holding tokenizer.json (+ tokenizer_config.json, config.json, generation_config.json).
    model: Path | None = Field(default=None, validation_alias=AliasChoices("GATEWAY_MODEL", "MODEL", "model"))
    # Several base models instead of `model`: a JSON (or YAML) file listing each one's directory, served
    # name and cells (common/models_config.py). The model settings below then apply to each model that
    # does not set its own (max_model_len, tool_parser, reasoning_parser), GATEWAY_CELLS to none.
    models_config: Path | None = None
    # Name clients pass as `model`; defaults to the model directory's name. Capped as a request's
    # `model` is, so that clients can always send back the name the server gave.
    served_model_name: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    # Longest prompt + output; defaults to config.json's max_position_embeddings.
    max_model_len: int | None = Field(default=None, gt=0)
    # A worker counts as alive while its last heartbeat is younger than this.
    heartbeat_timeout_s: float = Field(default=5.0, gt=0)
    # Give up on a request (and abort it) when it has not finished after this long.
    request_timeout_s: float = Field(default=3600.0, gt=0)
    # A client that disconnects cancels its request at once (as OpenAI and vLLM do) unless it asked for
    # `"resumable": true`: then it may resume (GET /v1/requests/{id}/stream) within this many seconds
    # before the request is aborted; 0 aborts even those at once.
    resume_grace_s: float = Field(default=30.0, ge=0)
    redis_url: str = redis_url_field()
    redis_cluster: bool = redis_cluster_field()
    cell: str = cell_field()
    # Cells to place requests in, comma-separated; empty: CBSERVE_CELL alone; `*`: every cell whose
    # batcher registered lately (common/streams.py CELLS_REGISTRY), CBSERVE_CELL included. /metrics has
    # each one's vllm:* load gauges; its cbserve:* batcher metrics and the dashboard show CBSERVE_CELL.
    cells: str = ""
    # How a request's cell is chosen (gateway/cell_router.py): cache_aware (least waiting + running
    # requests, less prefix_weight x the share of the prompt this gateway already sent the cell),
    # least_load (prefix_weight 0) or random. Ties go round-robin.
    cell_policy: CellPolicy = "cache_aware"
    # Requests of load a cell that was sent the whole prompt before is worth; 0 = least_load.
    cell_prefix_weight: float = Field(default=4.0, ge=0)
    # Prompt blocks (16 tokens) remembered per cell, least recently placed dropped first.
    cell_prefix_blocks: int = Field(default=100_000, gt=0)
    log_format: LogFormat = log_format_field()
    retention_s: int = retention_field()

    # --- LoRA adapters (vLLM's surface) -----------------------------------------------------------
    # Adapters served from the start (vLLM's --lora-modules): `name=path` items separated by spaces or
    # commas, or JSON objects {"name", "path", "base_model_name"} (a JSON list of them too). Each is
    # checked against its base model at start-up; a bad one stops the gateway.
    lora_modules: str = ""
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING);
    # off, both answer 404 as vLLM's unregistered routes do.
    allow_runtime_lora_updating: bool = False
    # Highest adapter rank accepted; 0: the lowest max_lora_rank the base model's workers announce.
    max_lora_rank: int = Field(default=0, ge=0)

    # --- security -------------------------------------------------------------------------------
    # API keys as SHA-256 hex digests, `[name:]digest` each: comma-separated here, one per line in the
    # file. With neither set, the API is open. The keys themselves are never stored.
    api_key_hashes: str = ""
    api_keys_file: Path | None = None
    # Per key (or for everyone together when no keys are set); 0 turns the limit off.
    rate_limit_rpm: int = Field(default=0, ge=0)  # requests per minute
    rate_limit_tpm: int = Field(default=0, ge=0)  # prompt + max_tokens (x n) per minute
    # Per end user of a key (the request's safety_identifier, or user), on top of the key's own.
    rate_limit_user_rpm: int = Field(default=0, ge=0)
    rate_limit_user_tpm: int = Field(default=0, ge=0)

    # --- limits ---------------------------------------------------------------------------------
    # Larger bodies are refused (413) before any JSON is parsed.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    # A body this large or larger is parsed, templated and tokenized on one of prepare_threads threads,
    # not the event loop (gateway/prepare_pool.py). Each thread holds about 120 bytes per byte of text
    # while it tokenizes (0.5 GB for a 4 MiB body); more large requests wait their turn. On 2 cores a
    # second thread added memory and no speed (docs/reliability.md, *A large request*).
    prepare_threads: int = Field(default=1, gt=0)
    prepare_inline_bytes: int = Field(default=16 * 1024, ge=0)
    # Longest prompt accepted; defaults to max_model_len - 1 (room for one output token).
    max_prompt_tokens: int | None = Field(default=None, gt=0)
    # Largest max_tokens accepted, and the default when a request gives none (capped by the context).
    max_tokens: int | None = Field(default=None, gt=0)
    # Chat message text is tokenized as text: "<|im_end|>" written by a client is not the control token.
    # true restores the old behaviour (control tokens from message text), for trusted clients only.
    chat_content_special_tokens: bool = False
    # The format the model writes tool calls in (openai_frontend/tools/parsers/): auto reads it from the
    # chat template; a name (hermes, llama3_json, pythonic, mistral, mistral_v11, qwen3_xml, deepseek_v3,
    # deepseek_v31, harmony, or vLLM's name for one of them) overrides it; none turns tool calling off.
    tool_parser: str = "auto"
    # How the model's thoughts are told apart (openai_frontend/reasoning/): auto reads it from the chat
    # template; think (`<think>` ... `</think>`; vLLM's deepseek_r1, qwen3, ...), harmony; none leaves them
    # in the content.
    reasoning_parser: str = "auto"

    # --- images (vision-language models; docs/api.md, Images) -------------------------------------
    # vLLM's --limit-mm-per-prompt, as JSON: the most images one request may hold.
    limit_mm_per_prompt: dict[str, int] = {"image": 8}
    # Width x height of one decoded image, and bytes of one encoded image (inline or fetched).
    max_image_pixels: int = Field(default=DEFAULT_MAX_IMAGE_PIXELS, gt=0)
    max_image_bytes: int = Field(default=20 * 1024 * 1024, gt=0)
    # vLLM's --allowed-media-domains: comma-separated hosts whose http(s) image URLs are fetched; `*`
    # any host; empty (the default) none, only data: URLs. Hosts resolving to a private, loopback or
    # link-local address are refused unless media_allow_private_addresses (an internal image store).
    allowed_media_domains: str = ""
    media_allow_private_addresses: bool = False
    # vLLM's VLLM_IMAGE_FETCH_TIMEOUT: one image URL's fetch, redirects included.
    media_fetch_timeout_s: float = Field(default=5.0, gt=0)

    # A stream with nothing to send for this long gets an SSE comment (`: keep-alive`), which every
    # client ignores: a client or proxy waiting on a queued or slow request sees the connection live.
    # 0 sends none.
    sse_keepalive_s: float = Field(default=5.0, ge=0)

    # --- connections (gateway/security/connection_guard.py) -----------------------------------------------
    # A client must send a request's headers within this many seconds of connecting (or of its first
    # byte on a kept-alive connection), and its body within body_timeout_s of the headers; else 408
    # and the socket is closed. An idle kept-alive connection is closed after keep_alive_s.
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    keep_alive_s: int = Field(default=5, gt=0)
    # Connections open at once in this gateway process; more are closed as they are accepted. Keep it
    # under the file-descriptor limit (`ulimit -n`), which also holds the Redis connections.
    max_connections: int = Field(default=4096, gt=0)

    # --- overload -------------------------------------------------------------------------------
    # Requests waiting for a slot (not yet claimed + waiting in the batcher) beyond which new ones get 429.
    # 0 turns the bound off.
    max_queued_requests: int = Field(default=1000, ge=0)
    # A request still waiting for its first step after this long fails with a `queue_timeout` error.
    max_queue_wait_s: float = Field(default=600.0, gt=0)
    # Share of Redis' `maxmemory` kept free for the requests already running: while less is free, new
    # requests get 503 `redis_full` (and /health says so). No effect on a Redis without maxmemory.
    redis_memory_headroom: float = Field(default=0.1, ge=0, lt=1)

    # --- stored chat completions (store: true) ---------------------------------------------------
    # How long a stored chat completion is kept, from when it was answered (OpenAI keeps them 30 days).
    stored_completions_ttl_s: int = Field(default=30 * 24 * 3600, gt=0)

    # --- files and batches (OpenAI Files and Batch API) ------------------------------------------
    # Largest file POST /v1/files accepts (413 past it); files are kept in Redis.
    max_file_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # Most requests (non-blank lines) in one batch input file.
    batch_max_requests: int = Field(default=50_000, gt=0)
    # Per API key (or for everyone together without keys): uploaded files kept at once, their bytes
    # together, and batches not yet finished; past them 429 (413 for bytes) naming the quota. 0: none.
    max_files_per_key: int = Field(default=100, ge=0)
    max_file_bytes_per_key: int = Field(default=256 * 1024 * 1024, ge=0)
    max_batches_per_key: int = Field(default=10, ge=0)
    # Files, batches and batch results are kept this long after creation (OpenAI keeps batch files
    # 30 days); it must outlast the 24 h completion window.
    file_expires_s: int = Field(default=30 * 24 * 3600, gt=24 * 3600)

    @field_validator("model")
    @classmethod
    def _model_has_tokenizer(cls, value: Path | None) -> Path | None:
        if value is not None:
            check_tokenizer(value, "GATEWAY_MODEL (or MODEL, --model)")
        return value

    @field_validator("models_config")
    @classmethod
    def _models_config_reads(cls, value: Path | None) -> Path | None:
        if value is not None:
            for m in load_models_config(value).models:  # ValueError says what is wrong with it
                check_tokenizer(m.model, f"GATEWAY_MODELS_CONFIG's model {m.name!r}")
        return value

    @model_validator(mode="after")
    def _one_way_to_name_models(self) -> GatewaySettings:
        if self.models_config is None:
            if self.model is None:
                raise ValueError(
                    "set GATEWAY_MODEL (or MODEL, --model) to a model directory, or GATEWAY_MODELS_CONFIG"
                )
            return self
        if self.model is not None or self.served_model_name is not None:
            raise ValueError(
                "GATEWAY_MODELS_CONFIG names every model: leave GATEWAY_MODEL (MODEL, --model) and "
                "GATEWAY_SERVED_MODEL_NAME unset, or list that model in the config"
            )
        if self.cells:
            raise ValueError("GATEWAY_MODELS_CONFIG gives each model its cells: leave GATEWAY_CELLS unset")
        return self

    @field_validator("limit_mm_per_prompt")
    @classmethod
    def _check_limit_mm(cls, value: dict[str, int]) -> dict[str, int]:
        extra = sorted(set(value) - {"image"})
        if extra:
            raise ValueError(f'images are the only modality served: use {{"image": N}}, not {extra[0]!r}')
        if any(n < 0 for n in value.values()):
            raise ValueError("a limit of images is 0 or more")
        return value

    def media_rules(self) -> MediaRules:
        """The images' rules every served model gets."""
        domains = tuple(
            d.strip().lower().rstrip(".") for d in self.allowed_media_domains.split(",") if d.strip()
        )
        return MediaRules(
            limit_images=self.limit_mm_per_prompt.get("image", MediaRules().limit_images),
            max_image_pixels=self.max_image_pixels,
            max_image_bytes=self.max_image_bytes,
            allowed_media_domains=domains,
            allow_private_media_addresses=self.media_allow_private_addresses,
            fetch_timeout_s=self.media_fetch_timeout_s,
        )

    @field_validator("tool_parser")
    @classmethod
    def _check_tool_parser(cls, value: str) -> str:
        return tool_parser_name(value, "GATEWAY_TOOL_PARSER")

    @field_validator("reasoning_parser")
    @classmethod
    def _check_reasoning_parser(cls, value: str) -> str:
        return reasoning_parser_name(value, "GATEWAY_REASONING_PARSER")

    @field_validator("cells")
    @classmethod
    def _check_cells(cls, value: str) -> str:
        if value.strip() == DISCOVER_CELLS:
            return DISCOVER_CELLS
        for cell in _split(value):
            check_cell(cell)  # ValueError names the bad one
        return value

    @property
    def discover_cells(self) -> bool:
        """Whether the cells come from the registry (GATEWAY_CELLS=*) rather than this list."""
        return self.cells == DISCOVER_CELLS

    @property
    def placement_cells(self) -> list[str]:
        """The cells this gateway places requests in (with discovery: CBSERVE_CELL, to start with)."""
        return [self.cell] if self.discover_cells else _split(self.cells) or [self.cell]

    @field_validator("api_key_hashes")
    @classmethod
    def _hashes_parse(cls, value: str) -> str:
        parse_key_hashes(value.split(","), "GATEWAY_API_KEY_HASHES")
        return value

    @field_validator("api_keys_file")
    @classmethod
    def _keys_file_parses(cls, value: Path | None) -> Path | None:
        if value is not None:
            if not value.is_file():
                raise ValueError(f"GATEWAY_API_KEYS_FILE {value} is not a readable file")
            parse_key_hashes(value.read_text().splitlines(), f"GATEWAY_API_KEYS_FILE {value}")
        return value

    @property
    def models_file(self) -> ModelsConfig | None:
        """GATEWAY_MODELS_CONFIG's models, read again (the validator has read it once)."""
        return None if self.models_config is None else load_models_config(self.models_config)

    @property
    def model_name(self) -> str:
        """The (first) served model's name."""
        if self.model is None:
            models = self.models_file
            assert models is not None  # one of the two is set (_one_way_to_name_models)
            return models.names[0]
        return self.served_model_name or self.model.resolve().name


DISCOVER_CELLS = "*"


def check_tokenizer(model_dir: Path, setting: str) -> None:
    if not (model_dir / "tokenizer.json").is_file():
        raise ValueError(
            f"{setting} must be a model directory containing tokenizer.json; {model_dir} has none"
        )


def tool_parser_name(value: str, setting: str) -> str:
    """Our name for a tool-call format (vLLM's names taken too); ValueError naming the ones we have."""
    from openai_frontend.tools.parsers import PARSERS, VLLM_NAMES

    return _parser_name(value, [*PARSERS], VLLM_NAMES, setting)


def reasoning_parser_name(value: str, setting: str) -> str:
    """Our name for a reasoning format (vLLM's names taken too); ValueError naming the ones we have."""
    from openai_frontend.reasoning import REASONING_PARSERS, VLLM_NAMES

    return _parser_name(value, [*REASONING_PARSERS], VLLM_NAMES, setting)


def _parser_name(value: str, ours: list[str], vllm_names: Mapping[str, str], setting: str) -> str:
    value = vllm_names.get(value, value)
    if value not in ("auto", "none", *ours):
        raise ValueError(f"{setting} must be auto, none or one of {', '.join([*ours, *vllm_names])}")
    return value


def _split(cells: str) -> list[str]:
    return [cell.strip() for cell in cells.split(",") if cell.strip()]
