"""Settings of one worker process, read from `WORKER_*` environment variables (CLI flags override)."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from common.logging_setup import LogFormat
from common.settings import (
    cell_field,
    log_format_field,
    redis_cluster_field,
    redis_url_field,
    retention_field,
)
from common.spec_decode.speculative_config import SpeculativeConfig, speculative_config_field
from gpu_worker.pooling_settings import PoolingSettings

Device = Literal["cpu", "cuda"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
AttentionBackendSetting = Literal["auto", "torch", "triton"]
Quantization = Literal["int8", "fp8"]
KVCacheDType = Literal["auto", "bfloat16", "float16"]


def default_worker_id() -> str:
    # Host and pid name the process in logs; the random suffix keeps ids unique when containers started
    # by `docker compose --scale` share a hostname pattern and pid 1.
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class WorkerSettings(PoolingSettings):  # its pooling fields: pooling_settings.py
    model_config = SettingsConfigDict(env_prefix="WORKER_", extra="ignore")

    # Model directory or hub id; `MODEL` is shared with the gateway so one variable configures both.
    model: str = Field(
        default="",
        validation_alias=AliasChoices("WORKER_MODEL", "MODEL", "model"),
        validate_default=True,
        description="Model directory or hub id (--model, WORKER_MODEL or MODEL).",
    )
    device: Device = Field(default="cpu", description="Where the model runs: cpu or cuda (--device).")
    dtype: DType = Field(
        default="auto",
        description="Weights dtype, and the KV cache's unless kv_cache_dtype narrows it; auto: float32 on "
        "cpu, bfloat16 on cuda.",
    )
    kv_cache_dtype: KVCacheDType = Field(
        default="auto",
        description="How K/V are stored (vLLM's --kv-cache-dtype, llama.cpp's --cache-type-k/-v): auto, "
        "in the model's dtype; bfloat16 or float16 halve a float32 model's KV bytes, and attention "
        "reads them back into the model's dtype. Greedy output is then close to, not equal to, "
        "auto's (docs/benchmarks.md gives the agreement).",
    )
    num_blocks: int | None = Field(
        default=None,
        gt=0,
        description="KV-cache blocks; default: sized from kv_cache_memory_mb or free GPU memory.",
    )
    kv_cache_memory_mb: int = Field(
        default=512, gt=0, description="KV-cache size on cpu when num_blocks is unset."
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="Share of the GPU's total memory this worker may use: weights, peak activations "
        "of a profiled step at max_num_batched_tokens, gpu_reserve_memory_mb, and the KV cache in what "
        "is left (as vLLM defines it).",
    )
    gpu_reserve_memory_mb: int = Field(
        default=1024,
        ge=0,
        description="Memory on cuda kept out of the KV cache for what the profiling step does not "
        "see: CUDA graphs and buffers allocated after it.",
    )
    max_num_seqs: int | None = Field(
        default=None,
        gt=0,
        description="Most requests in one step, registered with the batcher; default 64 on cpu, 256 on cuda.",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Tokens computed in one step (prefill chunks + decodes), registered with the "
        "batcher and profiled at startup; default 512 on cpu, 8192 on cuda.",
    )
    encoder_cache_size: int = Field(
        default=16384,
        gt=0,
        description="A vision-language model's encoder cache, in image embeddings (vLLM's "
        "encoder_cache_size): encoded images kept by content hash, least recently used out first.",
    )
    block_size: int = Field(default=16, gt=0, description="Tokens per KV-cache block.")
    max_model_len: int | None = Field(
        default=None,
        gt=0,
        description="Longest sequence; default min(model context, num_blocks * block_size).",
    )
    group_decodes: bool | None = Field(
        default=None,
        description="Torch attention backend: attend decodes in groups of similar context length, so "
        "that short ones do not read the longest one's padding; each group adds a gather and an SDPA "
        "per layer. Default: on "
        "for cpu (memory-bound there), off for cuda (where the extra kernel launches cost more).",
    )
    cascade_attention: bool | None = Field(
        default=None,
        description="Torch attention backend on cpu: decodes whose block tables start with the same "
        "blocks (a prefix-cache hit, the n choices of a request) attend over them once, together. "
        "Default: on for cpu; cpu only.",
    )
    attention_backend: AttentionBackendSetting = Field(
        default="auto",
        description="Paged attention: torch (gather + SDPA, the reference) or triton (kernels reading "
        "the KV pool in place; needs a power-of-two block size). auto: triton on cuda, torch on cpu.",
    )
    cuda_graphs: bool | None = Field(
        default=None,
        description="Replay decode-only steps as CUDA graphs captured at startup, one per padded batch "
        "size (needs the triton backend). Default: on for cuda, off for cpu; on cpu, true runs the same "
        "padded static buffers eagerly (how the tests check the padding).",
    )
    piecewise_cuda_graphs: bool = Field(
        default=False,
        description="With cuda_graphs, also replay the other steps of up to 512 tokens (prefill chunks "
        "with decodes) as piecewise graphs, one per layer and token bucket, attention run eagerly "
        "between them (Llama, Mistral, Qwen2, Qwen3), the pieces compiled by inductor with compile. "
        "Off until measured on a GPU. On cpu, runs the same padded pieces eagerly.",
    )
    compile: bool = Field(
        default=True,
        description="torch.compile (inductor) the model's forward, paged attention kept as an opaque "
        "op: fused norms, RoPE, activations and quantization (C++ on cpu, Triton on cuda). Llama, "
        "Mistral, Qwen2 and Qwen3; other architectures run transformers' forward. Falls back to "
        "eager, with a warning, when compilation fails at start-up.",
    )
    compile_cache_dir: str = Field(
        default_factory=lambda: str(Path.home() / ".cache" / "cbserve" / "inductor"),
        description="Where compiled graphs are cached, so a restarted worker does not compile again.",
    )
    quantization: Quantization | None = Field(
        default=None,
        description="Weights quantized at load from the checkpoint's: int8 (cpu: int8 weights and "
        "per-call int8 activations, fbgemm) or fp8 (cuda: float8_e4m3 weights and activations, "
        "per-channel and per-token scales). Unset: the checkpoint's dtype. Greedy output is then "
        "close to, not equal to, the unquantized model's (docs/benchmarks.md gives the agreement).",
    )
    enable_lora: bool = Field(
        default=False,
        description="Serve PEFT LoRA adapters next to the base model (vLLM's --enable-lora): requests "
        "name one in their LoRARequest, and requests of different adapters and of the base model share "
        "a step. Llama, Mistral, Qwen2 and Qwen3 (the worker's own decoder).",
    )
    max_loras: int = Field(
        default=1,
        gt=0,
        description="LoRA adapters one step may use (the device slots, each sized for max_lora_rank); "
        "the batcher holds back requests of other adapters until a slot is free.",
    )
    max_lora_rank: int = Field(
        default=16,
        gt=0,
        description="Highest LoRA rank served; every slot is this rank (smaller ranks are zero-padded). "
        "An adapter of a higher rank is refused.",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        gt=0,
        description="LoRA adapters kept in host memory, least recently used dropped first; default "
        "max_loras. At least max_loras.",
    )
    # The batcher's setting too: a draft model ("draft_model") is loaded and run by each worker.
    speculative_config: SpeculativeConfig | None = speculative_config_field()
    worker_id: str = Field(default_factory=default_worker_id, min_length=1, description="Unique per process.")
    num_threads: int | None = Field(default=None, gt=0, description="torch intra-op threads (cpu).")
    seed: int | None = Field(
        default=None, description="Seed of the generator used by requests without a seed."
    )
    heartbeat_interval_s: float = Field(default=1.0, gt=0.0, description="Seconds between heartbeats.")
    null_model: bool = Field(
        default=False,
        description="Benchmarks only: skip the forward pass and sample token 0, to time the control plane.",
    )
    null_model_step_ms: float = Field(
        default=0.0,
        ge=0.0,
        description="Benchmarks only, with null_model: each step's token 0s are ready this long after "
        "the device's previous step, as a GPU's would be, while the host goes on (0: at once).",
    )
    fail_on_token_id: int | None = Field(
        default=None,
        description="Fault injection for tests: a forward pass raises while any request in it holds "
        "this token id, as a poison input would.",
    )
    health_file: str | None = Field(
        default=None,
        description="File touched after every heartbeat that reached Redis (container healthchecks).",
    )
    redis_url: str = redis_url_field()
    redis_cluster: bool = redis_cluster_field()
    cell: str = cell_field()
    log_format: LogFormat = log_format_field()
    retention_s: int = retention_field()

    @field_validator("model", mode="after")
    @classmethod
    def _model_given(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("no model given: pass --model PATH or set MODEL / WORKER_MODEL")
        return value

    @field_validator("redis_url", mode="after")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            # The value is not echoed: it may hold a password.
            raise ValueError("REDIS_URL must start with redis://, rediss:// or unix://")
        return value

    @model_validator(mode="after")
    def _dtype_fits_device(self) -> WorkerSettings:
        if self.device == "cpu" and self.dtype == "float16":
            raise ValueError("float16 is slow or unsupported on cpu: set WORKER_DTYPE=float32 or bfloat16")
        return self

    @model_validator(mode="after")
    def _cascade_on_cpu(self) -> WorkerSettings:
        if self.cascade_attention and not self._cascade_supported:
            raise ValueError(
                "WORKER_CASCADE_ATTENTION needs WORKER_DEVICE=cpu and the torch attention backend"
            )
        return self

    @model_validator(mode="after")
    def _budget_fits_a_full_batch(self) -> WorkerSettings:
        if self.resolved_max_num_batched_tokens < self.resolved_max_num_seqs:
            raise ValueError(
                f"WORKER_MAX_NUM_BATCHED_TOKENS ({self.resolved_max_num_batched_tokens}) must be at least "
                f"WORKER_MAX_NUM_SEQS ({self.resolved_max_num_seqs}), or a full batch of decodes "
                "could not fit in one step"
            )
        return self

    @model_validator(mode="after")
    def _cpu_loras_hold_the_slots(self) -> WorkerSettings:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"WORKER_MAX_CPU_LORAS ({self.max_cpu_loras}) must be at least WORKER_MAX_LORAS "
                f"({self.max_loras}): every adapter of a step is read into host memory first"
            )
        return self

    @property
    def resolved_max_cpu_loras(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras

    @property
    def resolved_max_num_seqs(self) -> int:
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return 256 if self.device == "cuda" else 64

    @property
    def resolved_max_num_batched_tokens(self) -> int:
        # cuda: vLLM's default budget for an online server on a large GPU; cpu: what the batcher used.
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 8192 if self.device == "cuda" else 512

    @property
    def resolved_group_decodes(self) -> bool:
        return self.device == "cpu" if self.group_decodes is None else self.group_decodes

    @property
    def _cascade_supported(self) -> bool:
        # It calls the CPU flash kernel of the torch backend for the log-sum-exp.
        return self.device == "cpu" and self.resolved_attention_backend == "torch"

    @property
    def resolved_cascade_attention(self) -> bool:
        return self._cascade_supported if self.cascade_attention is None else self.cascade_attention

    @property
    def resolved_attention_backend(self) -> Literal["torch", "triton"]:
        if self.attention_backend == "auto":
            return "triton" if self.device == "cuda" else "torch"
        return self.attention_backend

    @property
    def resolved_cuda_graphs(self) -> bool:
        if self.cuda_graphs is None:
            return self.device == "cuda" and self.resolved_attention_backend == "triton"
        return self.cuda_graphs

    @property
    def resolved_dtype(self) -> Literal["float32", "bfloat16", "float16"]:
        """The dtype `auto` stands for on this device."""
        if self.dtype == "auto":
            return "bfloat16" if self.device == "cuda" else "float32"
        return self.dtype

    @property
    def resolved_kv_cache_dtype(self) -> Literal["float32", "bfloat16", "float16"]:
        """The dtype the KV pool is allocated in."""
        return self.resolved_dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype


# Where each setting comes from, for error messages; the rest are WORKER_<NAME>.
_SOURCES = {
    "model": "--model, WORKER_MODEL or MODEL",
    "device": "--device or WORKER_DEVICE",
    "redis_url": "REDIS_URL",
    "redis_cluster": "REDIS_CLUSTER",
    "cell": "CBSERVE_CELL",
    "log_format": "LOG_FORMAT",
    "cbserve_retention_s": "CBSERVE_RETENTION_S",
}


def explain_errors(exc: ValidationError) -> str:
    """One line per invalid setting, naming the flag or variable to change."""
    lines = ["invalid worker settings:"]
    for error in exc.errors():
        field = str(error["loc"][0]).lower() if error["loc"] else ""  # aliases report as REDIS_URL
        line = error["msg"].removeprefix("Value error, ")
        if field:
            source = _SOURCES.get(field, f"WORKER_{field.upper()}")
            hint = "" if "WORKER_" in line or "REDIS_URL" in line else f" (set {source})"
            # A bad REDIS_URL may carry a password: name the field, never echo its value.
            shown = "<hidden>" if field == "redis_url" else repr(error.get("input"))
            line = f"{field} = {shown}: {line}{hint}"
        lines.append(f"  {line}")
    return "\n".join(lines)
