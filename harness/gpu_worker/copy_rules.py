"""The step loop's host-device copies checked on the CPU: `copy_rules()` runs code whose device is
the `meta` device (tensors with shapes and no memory) while its host buffers are real, and raises
`CopyViolation` at the first copy that would block the host on a GPU:

- a host-to-device copy from memory that was not allocated pinned (`host_copies.pinned_empty`,
  or `Tensor.pin_memory()`), or one that is not `non_blocking` (either would wait for the stream);
- a device-to-host copy into unpinned memory or a blocking one, and any read of a device value on
  the host (`.item()`, `.tolist()`: they wait for the whole stream).

Events and the side stream are stand-ins that record what the code asks of them (`CopyRules.events`),
so a test can say where the host waits. Why not the fake `cuda` device of fake_cuda.py: the host
buffers are written through numpy views, which a FakeTensorMode would turn into views of no memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpu_worker.runner import host_copies, step_input_buffers
from harness.gpu_worker.capture_rules import patched

DEVICE = torch.device("meta")
aten = torch.ops.aten
_COPIES = {aten.copy_.default, aten._to_copy.default}


class CopyViolation(RuntimeError):
    pass


@dataclass(slots=True)
class FakeStream:
    name: str

    def wait_stream(self, other: FakeStream) -> None:
        """Ordering only: nothing to check on the host."""


@dataclass(slots=True)
class FakeEvent:
    rules: CopyRules
    recorded_on: str | None = None
    num_waits: int = 0

    def record(self) -> None:
        self.recorded_on = self.rules.stream.name

    def synchronize(self) -> None:
        self.num_waits += 1
        self.rules.waits.append(self)


class CopyRules(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.pinned: set[int] = set()  # data pointers of the pinned host allocations
        self.host_to_device: list[int] = []  # bytes of each copy, in order
        self.device_to_host: list[tuple[int, str]] = []  # (bytes, the stream it was queued on)
        self.events: list[FakeEvent] = []
        self.waits: list[FakeEvent] = []  # each host wait on an event, in order
        self.stream = FakeStream("main")

    def is_pinned(self, t: torch.Tensor) -> bool:
        base = t.untyped_storage().data_ptr()
        return base in self.pinned

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default or torch.Tag.data_dependent_output in func.tags:
            raise CopyViolation(f"{func} reads a device value on the host: it waits for the stream")
        if func in _COPIES:
            src = args[1] if func is aten.copy_.default else args[0]
            dst_device = args[0].device if func is aten.copy_.default else kwargs.get("device", src.device)
            non_blocking = (args[2] if len(args) > 2 else kwargs.get("non_blocking", False)) or False
            if src.device.type == "cpu" and dst_device.type == "meta":
                self._check(src, non_blocking, "host-to-device copy from")
                self.host_to_device.append(src.nbytes)
            elif src.device.type == "meta" and dst_device.type == "cpu":
                if func is not aten.copy_.default:
                    raise CopyViolation("a device-to-host copy into new (unpinned) memory: it waits")
                self._check(args[0], non_blocking, "device-to-host copy into")
                self.device_to_host.append((src.nbytes, self.stream.name))
                return args[0]  # a meta tensor has no values to copy
        return func(*args, **kwargs)

    def _check(self, host: torch.Tensor, non_blocking: bool, what: str) -> None:
        if not self.is_pinned(host):
            raise CopyViolation(f"a {what} pageable host memory: it waits for the stream")
        if not non_blocking:
            raise CopyViolation(f"a blocking {what} pinned memory: it waits for the stream")

    def pinned_empty(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        host = torch.empty(tuple(shape), dtype=dtype)
        if device.type == "meta":
            self.pinned.add(host.untyped_storage().data_ptr())
        return host

    def pin_memory(self, t: torch.Tensor) -> torch.Tensor:
        host = t.clone()
        self.pinned.add(host.untyped_storage().data_ptr())
        return host

    def new_event(self, device: torch.device) -> FakeEvent | None:
        if device.type != "meta":
            return None
        event = FakeEvent(self)
        self.events.append(event)
        return event

    @contextlib.contextmanager
    def on_stream(self, stream: FakeStream) -> Iterator[None]:
        saved, self.stream = self.stream, stream
        try:
            yield
        finally:
            self.stream = saved


@contextlib.contextmanager
def _shadowed(cls: type, name: str, value: Any) -> Iterator[None]:
    """`cls.name` is `value` inside, where the attribute is inherited (a tensor method from C)."""
    setattr(cls, name, value)
    try:
        yield
    finally:
        delattr(cls, name)


@contextlib.contextmanager
def copy_rules() -> Iterator[CopyRules]:
    """Inside, `meta` is the device: the step loop's copies are checked (see the module's doc)."""
    rules = CopyRules()
    side = FakeStream("side")
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(host_copies, "pinned_empty", rules.pinned_empty))
        for module in (host_copies, step_input_buffers):
            stack.enter_context(patched(module, "new_event", rules.new_event))
        stack.enter_context(patched(host_copies, "side_stream", lambda d: side if d.type == "meta" else None))
        stack.enter_context(patched(torch.cuda, "current_stream", lambda device=None: rules.stream))
        stack.enter_context(patched(torch.cuda, "stream", rules.on_stream))
        stack.enter_context(_shadowed(torch.Tensor, "record_stream", lambda self, stream: None))
        stack.enter_context(_shadowed(torch.Tensor, "pin_memory", lambda t: rules.pin_memory(t)))
        stack.enter_context(rules)
        yield rules
