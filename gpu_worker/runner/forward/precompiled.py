"""The compiled forward as a file: compiled once per model, code and host, loaded by every later worker.

torch.compile's own caches (inductor's FX graph cache, AOTAutograd's) skip only code generation: each
new process still traced the decoder with dynamo, looked the graph up, and loaded it, 2.5 s of a
restart on the 2-core CPU host. Dynamo's AOT compile (`aot_compile`, what vLLM's compile cache
uses) saves the traced bytecode and the compiled graph together; loading it traces nothing.

A file is found by a key of everything the graph was specialized on that is not in its own check:
the decoder's structure (module types, sizes, eps, scales, windows; tensor shapes, dtypes, layouts),
the device and host CPU (the C++ is built for it), torch and Python versions, inductor options and the
C++ ops' sources. The file itself records the source lines dynamo traced, checked when it is loaded:
an edited forward compiles again. Guards are dropped (every call passes the same kinds of tensors),
so a call runs the graph with no dynamo in between.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import logging
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_worker.kernels import cpu as cpu_kernels
from gpu_worker.runner.forward.decoder import Decoder

logger = logging.getLogger(__name__)

KEY_VERSION = "1"  # bumped when what the key covers, or the file's format, changes
_PLAIN = (bool, int, float, str, type(None), torch.dtype)


def _logits(decoder: Decoder, *inputs: Any) -> torch.Tensor:
    """What is compiled: the decoder is an argument, so its weights (and LoRA slots) are inputs, not
    part of the file."""
    return decoder.logits_of(*inputs)


def _describe(value: Any) -> str | None:
    """A plain attribute's value, a tensor's shape and kind; None for what the graph cannot depend on."""
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {value.dtype} {value.layout} {value.device.type}"
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value):
        return repr(value)
    return None


def _structure(decoder: nn.Module) -> list[str]:
    """Each submodule's type and its plain attributes, parameters and buffers, described."""
    lines = []
    for name, module in decoder.named_modules():
        values = {**vars(module), **module._parameters, **module._buffers}
        described = {k: _describe(v) for k, v in values.items() if not k.startswith("_")}
        lines.append(f"{name} {type(module).__qualname__} {sorted(described.items())}")
    return lines


def forward_key(decoder: nn.Module, device: torch.device, options: dict[str, Any] | None) -> str:
    parts = [
        KEY_VERSION,
        torch.__version__,
        platform.python_version(),
        str(options),
        device.type,
        torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_kernels.host_tag(),
        *(path.read_text() for path in cpu_kernels.SOURCES),  # the C++ ops' signatures
        *_structure(decoder),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _changed_source(compiled: Any) -> str | None:
    """The first traced source whose lines differ now from when the file was written; None if none."""
    for source in compiled.source_info().inlined_sources:
        lines = inspect.getsourcelines(importlib.import_module(source.module))[0]
        now = "".join(lines[source.firstlineno - 1 : source.lastlineno - 1])
        if hashlib.sha256(now.encode()).hexdigest() != source.checksum:
            return f"{source.module} lines {source.firstlineno}-{source.lastlineno}"
    return None


def mark_unbacked(inputs: Sequence[torch.Tensor | list[torch.Tensor]]) -> None:
    """Every input's first size unbacked: token and row counts of 0 or 1 get no graph of their own
    (dynamo specializes them), and no pool's number of blocks enters a guard (`inputs`: logits_of's,
    the lists being the layers' pools)."""
    for value in inputs:
        for tensor in value if isinstance(value, list) else [value]:
            torch._dynamo.decorators.mark_unbacked(tensor, 0)


def _example_inputs(device: torch.device, decoder: Decoder) -> list[Any]:
    """Inputs of the kinds every step passes (int64 ids, or a vision-language model's embeddings;
    positions, three rows each with M-RoPE; kept rows; each layer's K and V pools, of the layout the
    worker will allocate; with LoRA slots, each token's slot), marked so that no count, 0 and 1
    included, gets a graph of its own."""
    first = torch.zeros(4, dtype=torch.long)
    if decoder.takes_embeds:
        first = torch.zeros(4, decoder.embed_tokens.embedding_dim, dtype=decoder.dtype)
    positions = torch.arange(4).unsqueeze(-1).repeat(1, 3) if decoder.mrope else torch.arange(4)
    tensors = [first, positions, torch.tensor([1, 3])]
    if decoder.lora_config is not None:
        tensors.append(torch.tensor([-1, 0, 0, -1]))
    tensors = [tensor.to(device) for tensor in tensors]
    block_size, dtype = decoder.pool_layout
    layers: list[Any] = list(decoder.layers)  # nn.ModuleList
    shapes = [(3, block_size, layer.kv_size // layer.head_dim, layer.head_dim) for layer in layers]
    k_pools, v_pools = ([torch.zeros(shape, dtype=dtype, device=device) for shape in shapes] for _ in "kv")
    inputs: list[Any] = [*tensors[:3], k_pools, v_pools, *tensors[3:]]
    mark_unbacked(inputs)
    return inputs


class PrecompiledForward:
    """`decoder.run` from a compiled-forward file: loaded when one fits, else compiled and saved."""

    def __init__(
        self,
        decoder: Decoder,
        device: torch.device,
        cache_dir: Path,
        options: dict[str, Any] | None,
        backend: str | Callable[..., Any] = "inductor",
    ) -> None:
        self.decoder = decoder
        self.path = cache_dir / "precompiled" / f"{forward_key(decoder, device, options)}.bin"
        self.loaded = False  # True when the file was loaded, False when this process compiled it
        loaded = self._load() if self.path.exists() else None
        self.fn: Any = loaded if loaded is not None else self._compile(device, options, backend)

    def __call__(self, *inputs: Any) -> torch.Tensor:
        return self.fn(self.decoder, *inputs)

    def _load(self) -> Any:
        started = time.perf_counter()
        try:
            # The key names this CPU, so the vector ISAs inductor probed when compiling the file hold:
            # their base probes (a Python subprocess each, seconds on a busy host) are skipped.
            with self.path.open("rb") as file, torch._inductor.config.patch({"cpp.vec_isa_ok": True}):
                compiled = torch.compiler.load_compiled_function(file)
            changed = _changed_source(compiled)
        except Exception as exc:  # written by another torch, or damaged: compile it again
            logger.warning("cannot load the compiled forward %s, compiling again: %s", self.path, exc)
            return None
        if changed is not None:
            logger.info("the forward's code changed since it was compiled (%s): compiling again", changed)
            return None
        self.loaded = True
        logger.info(
            "loaded the compiled forward from cache in %.1f s (%s)", time.perf_counter() - started, self.path
        )
        return compiled

    def _compile(self, device: torch.device, options: dict[str, Any] | None, backend: Any) -> Any:
        num_layers = len(self.decoder.layers)
        logger.info(
            "compiling the forward, none cached for this model and code: %s", _estimate(self.path, num_layers)
        )
        started = time.perf_counter()
        compiler: Any = torch.compile(
            _logits,
            fullgraph=True,
            dynamic=True,
            backend=backend,
            # No guards: the key and the source check stand for them (and no guard is serializable
            # on a oneDNN-packed weight).
            options={**(options or {}), "guard_filter_fn": lambda guards: [False for _ in guards]},
        )
        # Floats (eps, scales) as constants: a symbolic float made dynamo trace everything twice.
        with torch.inference_mode(), torch._dynamo.config.patch(specialize_float=True):
            inputs = _example_inputs(device, self.decoder)
            compiled = compiler.aot_compile(((self.decoder, *inputs), {}))
        seconds = time.perf_counter() - started
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            compiled.save_compiled_function(str(self.path))  # to a temporary file, then renamed
            _record(self.path, seconds, num_layers)
        except OSError as exc:  # a read-only cache: this worker still runs what it compiled
            logger.warning("compiled the forward in %.1f s but cannot cache it: %s", seconds, exc)
            return compiled
        logger.info("compiled the forward in %.1f s, cached as %s", seconds, self.path)
        return compiled


def _record(path: Path, seconds: float, num_layers: int) -> None:
    """The last compile's time, for the next first start's estimate."""
    (path.parent / "last_compile.json").write_text(json.dumps({"seconds": seconds, "num_layers": num_layers}))


def _estimate(path: Path, num_layers: int) -> str:
    try:
        last = json.loads((path.parent / "last_compile.json").read_text())
        seconds = float(last["seconds"]) * num_layers / max(1, int(last["num_layers"]))
    except (OSError, ValueError, KeyError, TypeError):
        return "the first in this cache, typically tens of seconds"
    return f"about {seconds:.0f} s, as the last one here took"
