"""Which systems a comparison runs: `--system NAME=URL`, `--launch NAME=KIND[:k=v,...]`, or a spec file.

A spec file (TOML or JSON) names the systems and, optionally, the benchmark settings, so one command
reruns a whole comparison:

    model = "models/gpt2-small-llama"      # tokenizer, and the model every launched system serves
    baseline = "static-8"
    [benchmark]                            # any `python -m benchmarks.serve` option, by its dest name
    dataset = "random"
    num_prompts = 200
    [[system]]
    name = "static-8"
    launch = { kind = "static", batch_size = 8 }
    [[system]]
    name = "cbserve"
    launch = { kind = "cbserve", workers = 1, env = { BATCHER_MAX_NUM_SEQS = "64" } }
    [[system]]
    name = "vllm"
    base_url = "http://127.0.0.1:8000"
    lora_modules = ["sql", "chat"]         # optional: request i names adapter i mod 2 as its `model`

Launch kinds: `static` (benchmarks.baselines.static_server), `inprocess` (our scheduler and model runner in
one process, no Redis: benchmarks.baselines.static_server --engine inprocess), `cbserve` (redis-server +
batcher + workers + gateway; `cells = N` starts N cells of `workers` each behind the one gateway),
`transformers` (`transformers serve --continuous-batching`), `llama-server` (llama.cpp's server on the
model converted to GGUF: benchmarks/baselines/llama_launch.py lists its options), `command` (any server:
an argv with `{port}`, `{model}` and `{python}` placeholders, and a health path). On the command line,
lower-case keys are the kind's options and UPPER-CASE keys become environment variables of the
launched processes: `--launch ours=cbserve:workers=2,BATCHER_MAX_NUM_SEQS=128`.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from benchmarks.baselines.llama_launch import OPTION_NAMES as LLAMA_SERVER_OPTIONS
from benchmarks.baselines.llama_launch import LlamaServerOptions
from benchmarks.load.client import BACKENDS, Backend, PromptFormat

KIND_OPTIONS: dict[str, frozenset[str]] = {
    "static": frozenset({"batch_size", "batch_timeout_ms", "device", "dtype", "num_threads"}),
    "inprocess": frozenset(
        {"device", "dtype", "num_threads", "max_num_seqs", "max_num_batched_tokens", "scheduling_policy"}
    ),
    "cbserve": frozenset({"workers", "cells", "gateways", "device", "num_threads"}),
    "transformers": frozenset(
        {"continuous_batching", "cb_num_blocks", "cb_max_batch_tokens", "cb_block_size", "device", "dtype"}
        | {"attn_implementation"}
    ),
    "llama-server": LLAMA_SERVER_OPTIONS,
    "command": frozenset({"port"}),
}
PROMPT_FORMATS: tuple[PromptFormat, ...] = ("ids", "text")


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    kind: str  # one of KIND_OPTIONS
    options: dict[str, Any] = field(default_factory=dict)  # the kind's options (see KIND_OPTIONS)
    env: dict[str, str] = field(default_factory=dict)  # extra environment of the launched processes
    command: tuple[str, ...] = ()  # kind `command`: argv with {port} / {model} / {python} placeholders
    health_path: str = "/health"  # GET answers 200 once the server can take requests
    startup_timeout_s: float = 900.0


@dataclass(frozen=True, slots=True)
class SystemSpec:
    name: str
    base_url: str | None = None  # None for a launched system: the launcher picks the port
    backend: Backend = "openai"
    prompt_format: PromptFormat = "ids"
    model: str | None = None  # the `model` sent; None: the server's first /v1/models entry
    launch: LaunchSpec | None = None
    # JSON merged into this system's request bodies (e.g. one system's `structured_outputs`).
    extra_body: dict[str, Any] = field(default_factory=dict)
    lora_modules: tuple[str, ...] = ()  # adapters its requests are spread over (benchmarks/load/runner.py)


def _split_name(value: str, flag: str, form: str) -> tuple[str, str]:
    name, sep, rest = value.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"{flag} takes {form}; got {value!r}")
    return name, rest


def parse_system_arg(
    value: str, backend: Backend = "openai", prompt_format: PromptFormat = "ids"
) -> SystemSpec:
    """`NAME=URL`: a server that is already running."""
    name, url = _split_name(value, "--system", "NAME=BASE_URL")
    return SystemSpec(name=name, base_url=url, backend=backend, prompt_format=prompt_format)


def parse_launch_arg(value: str) -> SystemSpec:
    """`NAME=KIND[:key=value,...]`: a server the benchmark starts and stops itself."""
    name, rest = _split_name(value, "--launch", "NAME=KIND[:key=value,...]")
    kind, _, raw = rest.partition(":")
    options: dict[str, Any] = {}
    env: dict[str, str] = {}
    for item in filter(None, raw.split(",")):
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"--launch {value!r}: {item!r} is not key=value")
        (env if key.isupper() else options)[key] = val
    return system_from_dict({"name": name, "launch": {"kind": kind, **options, "env": env}})


def _launch_from_dict(name: str, raw: dict[str, Any]) -> LaunchSpec:
    raw = dict(raw)
    kind = str(raw.pop("kind", ""))
    if kind not in KIND_OPTIONS:
        raise ValueError(
            f"system {name!r}: launch kind must be one of {', '.join(KIND_OPTIONS)}, got {kind!r}"
        )
    env = {str(k): str(v) for k, v in (raw.pop("env", None) or {}).items()}
    command = tuple(str(a) for a in raw.pop("command", ()) or ())
    health_path = str(raw.pop("health_path", "/health"))
    startup_timeout_s = float(raw.pop("startup_timeout_s", 900.0))
    unknown = set(raw) - KIND_OPTIONS[kind]
    if unknown:
        allowed = ", ".join(sorted(KIND_OPTIONS[kind])) or "none"
        raise ValueError(f"system {name!r}: unknown {kind} option(s) {sorted(unknown)}; allowed: {allowed}")
    if kind == "command" and not command:
        raise ValueError(f"system {name!r}: a `command` launch needs command = [argv...]")
    if kind == "llama-server":
        try:
            LlamaServerOptions.from_options(raw)  # bad values fail when the spec is read, not mid-run
        except ValueError as exc:
            raise ValueError(f"system {name!r}: {exc}") from None
    return LaunchSpec(kind, raw, env, command, health_path, startup_timeout_s)


def system_from_dict(raw: dict[str, Any]) -> SystemSpec:
    name = str(raw.get("name") or "")
    if not name:
        raise ValueError(f"every system needs a name: {raw}")
    launch = _launch_from_dict(name, raw["launch"]) if raw.get("launch") else None
    if launch is None and not raw.get("base_url"):
        raise ValueError(f"system {name!r} needs base_url, or launch to start one")
    # `transformers serve` takes text prompts only, and its own request dialect.
    hf = launch is not None and launch.kind == "transformers"
    backend = str(raw.get("backend") or ("transformers" if hf else "openai"))
    prompt_format = str(raw.get("prompt_format") or ("text" if hf else "ids"))
    if backend not in BACKENDS:
        raise ValueError(f"system {name!r}: backend must be one of {', '.join(BACKENDS)}")
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"system {name!r}: prompt_format must be one of {', '.join(PROMPT_FORMATS)}")
    return SystemSpec(
        name=name,
        base_url=raw.get("base_url"),
        backend=cast(Backend, backend),
        prompt_format=cast(PromptFormat, prompt_format),
        model=raw.get("model_name"),
        launch=launch,
        extra_body=dict(raw.get("extra_body") or {}),
        lora_modules=tuple(str(name) for name in raw.get("lora_modules") or ()),
    )


@dataclass(frozen=True, slots=True)
class SpecFile:
    systems: list[SystemSpec]
    benchmark: dict[str, Any]  # option dest -> value
    model: str | None
    baseline: str | None


def load_spec_file(path: Path) -> SpecFile:
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    systems = [system_from_dict(s) for s in data.get("system") or data.get("systems") or []]
    return SpecFile(
        systems=systems,
        benchmark=dict(data.get("benchmark") or {}),
        model=data.get("model"),
        baseline=data.get("baseline"),
    )
