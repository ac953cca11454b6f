"""Child processes the launcher owns: spawn with a log file, watch, and stop without leaving any behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# prctl(2) option: the kernel sends the given signal to this process when its parent dies.
_PR_SET_PDEATHSIG = 1
# Loaded here, in the parent: between fork and exec the child should only make the call.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _child_setup(parent_pid: int) -> Callable[[], None]:
    """What runs in the child between fork and exec.

    Children get their own process group so a terminal Ctrl-C reaches only the launcher, which then
    stops them in order (gateway and workers before the Redis they talk to). On Linux they also ask
    for SIGTERM when the launcher dies, so even a SIGKILLed launcher leaves nothing running.
    """

    def setup() -> None:
        os.setpgid(0, 0)
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent_pid:  # the launcher died before prctl took effect
                os._exit(1)

    return setup


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    # How it was started, so that `respawn` can start it again the same way.
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def log_tail(self, num_lines: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-num_lines:]) or "(log is empty)"

    def signal_group(self, signum: int) -> None:
        """Signal the child's whole process group: anything it forked goes too."""
        # ProcessLookupError: already gone; PermissionError: the group id now names someone else's group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)


def spawn(name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> Child:
    """Start `argv` with stdout and stderr appended to `log_path`; stdin is closed."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            # preexec_fn is unsafe only with threads running; the launcher starts none.
            preexec_fn=_child_setup(os.getpid()),
        )
    return Child(name=name, proc=proc, log_path=log_path, argv=list(argv), env=env)


def respawn(child: Child) -> Child:
    """`child` started again as it was first started, its output appended to the same log."""
    return spawn(child.name, child.argv, child.log_path, child.env)


def stop(
    children: Sequence[Child], timeout_s: float = 10.0, force: Callable[[], bool] = lambda: False
) -> None:
    """SIGTERM every child, wait up to `timeout_s` for all of them, then SIGKILL what is left.

    `force` is polled while waiting: when it turns true (a second Ctrl-C) the wait ends early.
    Every child is reaped, so no zombie remains either.
    """
    for child in children:
        if not child.exited():
            child.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(not c.exited() for c in children) and time.monotonic() < deadline and not force():
        time.sleep(0.05)
    for child in children:
        if not child.exited():
            # Only while the leader is unreaped is its pid (= the group id) surely still ours.
            print(f"cbserve: {child.name} did not stop in time; killing it", file=sys.stderr)
            child.signal_group(signal.SIGKILL)
        child.proc.wait()
