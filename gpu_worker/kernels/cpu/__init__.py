"""C++ kernels for the CPU, built with the host's compiler at first use (torch.utils.cpp_extension)
and cached in torch's extensions directory, so a restart loads them in milliseconds.

`python -m gpu_worker.kernels.cpu` builds them ahead of time (`make test` does, so that no test's
worker waits on the compiler).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = [
    Path(__file__).with_name(name)
    for name in ("paged_decode.cpp", "paged_attention.cpp", "packed_linear.cpp")
]
OPS = (
    "paged_decode_attention",
    "paged_attention",
    "set_attention_step",
    "clear_attention_step",
    "packed_linear",
)


def _cpu_flags() -> str:
    try:
        return next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return "unknown"


def _host_tag(flags: str) -> str:
    """The build is tuned for this CPU (-march=native): a cache shared with another CPU model must not
    load it, so the extension's name carries a digest of the CPU's flags."""
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


def _sources_tag() -> str:
    """Builds of other checkouts (or versions) of these sources get names of their own: ninja
    rebuilds whenever a build's command (which names the source paths) differs from the last one in
    the directory, so two checkouts sharing one name rebuilt it in turn, half a minute per start."""
    digest = hashlib.sha1()
    for path in SOURCES:
        digest.update(str(path).encode() + path.read_bytes())
    return digest.hexdigest()[:10]


def host_tag() -> str:
    """This CPU's tag: code built for it (-march=native) runs only where the tag is the same."""
    return _host_tag(_cpu_flags())


def _vector_flags(flags: str) -> list[str]:
    """ATen's Vectorized<float> picks its width from CPU_CAPABILITY, as inductor's C++ kernels set it;
    without it the kernels' exp and reductions fall back to scalar loops."""
    have = set(flags.split())
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= have:
        return ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"]
    if {"avx2", "fma"} <= have:
        return ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return []


def extension_name() -> str:
    return f"cbserve_cpu_kernels_{_host_tag(_cpu_flags())}_{_sources_tag()}"


def build_directory() -> Path:
    from torch.utils import cpp_extension

    return Path(cpp_extension._get_build_directory(extension_name(), verbose=False))


@contextlib.contextmanager
def _exclusive_build(directory: Path) -> Iterator[None]:
    """One builder at a time, under a lock the kernel releases when its holder dies. torch's own
    (a `lock` file, FileBaton) stays behind a builder killed mid-build, and every later start waited
    on it for ever; found while this lock is held, such a file can only be one of those."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "cbserve.flock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        yield


@functools.cache
def load() -> bool:
    """Build (or load the cached build of) the kernels and register their ops under
    `torch.ops.cbserve_cpu`, with the shape functions a compiled graph needs of the ops it calls;
    False, with a warning, where no C++ compiler can build them."""
    from torch.utils import cpp_extension

    name, directory = extension_name(), build_directory()
    if not (directory / f"{name}.so").exists():
        log.info("building the CPU kernels, once per host and checkout: about 30 s")
    try:
        with _exclusive_build(directory):
            cpp_extension.load(
                name=name,
                sources=[str(path) for path in SOURCES],
                extra_cflags=["-O3", "-march=native", "-fopenmp", *_vector_flags(_cpu_flags())],
                extra_ldflags=["-fopenmp"],
                is_python_module=False,
                verbose=False,
            )
    except Exception as exc:  # a missing compiler or headers: the torch paths still work
        log.warning(
            "CPU kernels unavailable: decodes gather their K/V, fp32 weights go through F.linear: %s", exc
        )
        return False
    if not all(hasattr(torch.ops.cbserve_cpu, op) for op in OPS):
        return False
    _register_fakes()
    return True


def _register_fakes() -> None:
    """Output shapes of the ops the decoder's compiled graph calls (gpu_worker/runner/forward/:
    decoder.py, linear.py)."""

    @torch.library.register_fake("cbserve_cpu::paged_attention")
    def _(query: torch.Tensor, *_: object) -> torch.Tensor:
        return torch.empty_like(query, memory_format=torch.contiguous_format)

    @torch.library.register_fake("cbserve_cpu::packed_linear")
    def _(
        x: torch.Tensor, weight_packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
    ) -> torch.Tensor:
        return x.new_empty(x.shape[0], out_features)
