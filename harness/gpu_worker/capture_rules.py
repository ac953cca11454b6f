"""What CUDA forbids inside a graph capture, checked on the CPU: `capture_rules()` runs a region whose
tensors are fake `cuda` tensors (harness/gpu_worker/fake_cuda.py) and raises `CaptureViolation` at the
first thing a capture on a GPU would refuse, or would capture wrong:

- a tensor made on the host (`torch.arange(n)`, `torch.tensor([...])`): the host work happens once,
  at capture, and a replay never repeats it; copied to the device it is the next rule (a 0-dim one is
  a scalar, which a device op takes by value, as it takes a Python number: allowed);
- a copy between host and device memory, either way: from pageable memory PyTorch refuses it during
  capture ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor
  is pinned"); a pinned copy is captured but replays the host memory of capture time (and a fake
  tensor cannot be pinned on a machine without CUDA, so none is allowed here);
- a call that waits for the device: a device value read on the host (`.item()`, `.tolist()`,
  `bool(t)`, `.cpu()`), an op whose output shape depends on device data (`nonzero`, `masked_select`,
  `unique`, boolean-mask indexing, `repeat_interleave` without `output_size`), `torch.cuda.synchronize`
  and a stream's or event's `synchronize`;
- a Triton kernel launched with a host tensor among its arguments (a host address on the GPU).

Custom ops defined in Python (`torch.library.custom_op`, as `cbserve::paged_attention`) run their
body, not their fake, so the attention backend's own Python is checked too; Triton kernels are not
run (a fake tensor has no memory): each launch is checked and recorded in `CaptureRules.launches`.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch._library.custom_ops import _maybe_get_opdef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from triton.runtime.jit import KernelInterface

HARNESS = Path(__file__).resolve().parents[1]
REPO = HARNESS.parent

aten = torch.ops.aten
# Ops whose output shape is static unless an index is a boolean mask (then they call nonzero).
_MASK_INDEXED = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}
# Reads of a device value on the host that carry no `data_dependent_output` tag.
_HOST_READS = {aten.is_nonzero.default}
# The `output_size` argument makes repeat_interleave's shape static.
_REPEAT_INTERLEAVE = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}


class CaptureViolation(RuntimeError):
    """A RuntimeError, as torch's own capture errors are: the worker's fallback treats both alike."""


def _where() -> str:
    """The innermost frame of the project's own code (not torch's, nor this harness's)."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename)
        if path.is_relative_to(REPO) and not path.is_relative_to(HARNESS) and ".venv" not in path.parts:
            return f"{path.relative_to(REPO)}:{frame.lineno} ({frame.line})"
    return "outside the project"


def _violation(what: str) -> CaptureViolation:
    return CaptureViolation(f"inside a CUDA graph capture: {what}, at {_where()}")


def _devices(values: Any) -> set[str]:
    return {t.device.type for t in tree_leaves(values) if isinstance(t, torch.Tensor)}


def _waits(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why `func` makes the host wait for the device, or None."""
    if func in _HOST_READS or torch.Tag.data_dependent_output in func.tags:
        return "reads a device value on the host"
    if func in _MASK_INDEXED:
        indices = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(t.dtype in (torch.bool, torch.uint8) for t in indices):
            return "indexes with a boolean mask (its shape depends on device data)"
        return None
    if func in _REPEAT_INTERLEAVE:
        return None if kwargs.get("output_size") is not None else "repeat_interleave without output_size"
    if torch.Tag.dynamic_output_shape in func.tags:
        return "its output's shape depends on device data"
    return None


class CaptureRules(TorchDispatchMode):
    """Raises `CaptureViolation` at the first op a capture refuses; enter it inside the FakeTensorMode
    that made the region's tensors (fake_cuda.py), through `capture_rules()`."""

    def __init__(self) -> None:
        super().__init__()
        self.launches: list[str] = []  # the Triton kernels launched, by name, in order

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = str(func)
        why = _waits(func, args, kwargs)
        if why is not None:
            raise _violation(f"{name} waits for the device: {why}")
        inputs = _devices((args, kwargs))
        target = kwargs.get("device")
        if "cpu" in inputs and isinstance(target, torch.device) and target.type == "cuda":
            raise _violation(f"{name} copies host memory to the device")
        opdef = _maybe_get_opdef(func)
        if opdef is not None:  # a Python custom op: its body is what runs on the GPU
            with self:
                return opdef._init_fn(*args, **kwargs)
        out = func(*args, **kwargs)
        outputs = _devices(out)
        if "cpu" in outputs and "cuda" in inputs:
            raise _violation(f"{name} copies device memory to the host (it waits for the device)")
        # A 0-dim host tensor is a scalar: a device op takes it by value, as a Python number (and
        # `x[i] = 0.0` on a cuda tensor makes one).
        made = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.device.type == "cpu"]
        if any(t.dim() > 0 for t in made):
            raise _violation(f"{name} makes a host tensor")
        host_inputs = [
            t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.device.type == "cpu"
        ]
        # A 0-dim host tensor in a device op is a scalar argument, not a copy (except to copy it).
        copies = "copy" in name or name.startswith("aten.to.")
        if "cuda" in outputs and any(t.dim() > 0 or copies for t in host_inputs):
            raise _violation(f"{name} copies host memory to the device")
        return out

    @property
    def launch_of(self) -> Callable[[Any, Any], Callable[..., None]]:
        """What `kernel[grid]` becomes inside the region (a function, so that it binds to the kernel as
        Triton's own `__getitem__` does): a launch checked, recorded, not run."""
        return lambda kernel, grid: self._launch(kernel)

    def _launch(self, kernel: Any) -> Callable[..., None]:

        def checked(*args: Any, **kwargs: Any) -> None:
            for value in [*args, *kwargs.values()]:
                if isinstance(value, torch.Tensor) and value.device.type != "cuda":
                    raise _violation(f"Triton kernel {kernel.__name__} gets a host tensor argument")
            self.launches.append(str(kernel.__name__))

        return checked


def _refuse(what: str) -> Callable[..., None]:
    def refused(*_: object, **__: object) -> None:
        raise _violation(f"{what} waits for the device")

    return refused


@contextlib.contextmanager
def patched(target: Any, name: str, value: Any) -> Iterator[None]:
    """`target.name` is `value` inside (a class's own attribute, or a module's)."""
    saved = target.__dict__[name] if isinstance(target, type) else getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, saved)


@contextlib.contextmanager
def capture_rules() -> Iterator[CaptureRules]:
    """The region inside is checked as if a CUDA graph captured it; yields the rules (its launches)."""
    rules = CaptureRules()
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(torch.cuda, "synchronize", _refuse("torch.cuda.synchronize")))
        stack.enter_context(patched(torch.cuda.Stream, "synchronize", _refuse("Stream.synchronize")))
        stack.enter_context(patched(torch.cuda.Event, "synchronize", _refuse("Event.synchronize")))
        stack.enter_context(patched(KernelInterface, "__getitem__", rules.launch_of))
        stack.enter_context(rules)
        yield rules
