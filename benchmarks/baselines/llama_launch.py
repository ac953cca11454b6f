"""The `llama-server` launch kind: llama.cpp's server on the benchmark model converted to GGUF.

    [[system]]
    name = "llama-server-f32"
    launch = { kind = "llama-server", outtype = "f32", slots = 16, threads = 2 }

Options (all optional):
- `outtype`: the GGUF weight type, `f32` (default), `f16`, `bf16` or `q8_0` (benchmarks/baselines/gguf.py
  converts the spec's model once per type and caches it in `<model>/gguf/`);
- `slots`: requests decoded together (`--parallel`, default 16); continuous batching is on;
- `threads`: CPU threads for decode and for prompts (`--threads`, `--threads-batch`, default 2);
- `ctx_per_slot`: context tokens each slot holds (default 1024). Without a unified KV cache the
  server splits `--ctx-size` evenly over its slots, so it is started with slots x ctx_per_slot: a
  request's prompt + max_tokens must fit in one slot's share;
- `kv_type`: the KV cache's element type (`--cache-type-k/-v`, default the server's own, f16);
- `binary`: the server executable (default .llama/bin/llama-server, built by llama_server.sh).

llama-server is sent the same token-id prompts, `max_tokens` and `ignore_eos` as every other system
(its /v1/completions takes a list of ints as `prompt`); its streamed usage counts the output tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.baselines.gguf import BYTES_PER_WEIGHT, OUTTYPES

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BINARY = ROOT / ".llama" / "bin" / "llama-server"
OPTION_NAMES = frozenset({"outtype", "slots", "threads", "ctx_per_slot", "kv_type", "binary"})
KV_TYPES = ("f32", "f16", "bf16", "q8_0")


@dataclass(frozen=True, slots=True)
class LlamaServerOptions:
    outtype: str = "f32"
    slots: int = 16
    threads: int = 2
    ctx_per_slot: int = 1024
    kv_type: str | None = None  # None: the server's default (f16)
    binary: str = str(DEFAULT_BINARY)

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> LlamaServerOptions:
        """Validated options of a launch spec (values may be strings, as `--launch` gives them)."""
        default = cls()
        unknown = set(options) - OPTION_NAMES - {"port"}
        if unknown:
            raise ValueError(f"unknown llama-server option(s) {sorted(unknown)}")
        outtype = str(options.get("outtype", default.outtype))
        if outtype not in OUTTYPES:
            raise ValueError(f"llama-server outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
        kv_type = options.get("kv_type")
        if kv_type is not None and str(kv_type) not in KV_TYPES:
            raise ValueError(f"llama-server kv_type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}")
        keys = ("slots", "threads", "ctx_per_slot")
        sizes = {key: int(options.get(key, getattr(default, key))) for key in keys}
        bad = [key for key, value in sizes.items() if value < 1]
        if bad:
            raise ValueError(f"llama-server {', '.join(bad)} must be at least 1")
        return cls(
            outtype=outtype,
            slots=sizes["slots"],
            threads=sizes["threads"],
            ctx_per_slot=sizes["ctx_per_slot"],
            kv_type=None if kv_type is None else str(kv_type),
            binary=str(options.get("binary", default.binary)),
        )

    @property
    def ctx_size(self) -> int:
        return self.slots * self.ctx_per_slot

    @property
    def weight_bytes(self) -> float:
        """Bytes one weight of the served GGUF takes (for the roofline)."""
        return BYTES_PER_WEIGHT[self.outtype]

    @property
    def kv_bytes(self) -> float:
        return BYTES_PER_WEIGHT[self.kv_type or "f16"]


def server_command(options: LlamaServerOptions, gguf: Path, port: int) -> list[str]:
    """llama-server's argv: the model, this host's port, the slots, the threads and the context."""
    argv = [options.binary, "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--parallel", str(options.slots), "--cont-batching", "--ctx-size", str(options.ctx_size)]
    argv += ["--threads", str(options.threads), "--threads-batch", str(options.threads)]
    if options.kv_type is not None:
        argv += ["--cache-type-k", options.kv_type, "--cache-type-v", options.kv_type]
    return argv
