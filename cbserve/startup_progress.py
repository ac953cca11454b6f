"""What the starting workers are doing, shown while `cbserve up` waits for them: each worker's phase
lines (loading weights, building the CPU kernels, compiling or loading the compiled forward, profiling
memory) as they are logged, and on a terminal a line that counts the seconds of the current phase,
with a bar against the phase's own estimate where it gives one ("about 40 s").

Read from the workers' log files, so a worker needs no channel of its own to the launcher."""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

# The text format's line (common/logging_setup.py): time, level, logger, message.
_TEXT_LINE = re.compile(r"^\S+ \S+ (?P<level>INFO|WARNING|ERROR) (?P<logger>[\w.]+): (?P<msg>.*)$")
_ESTIMATE = re.compile(r"about (\d+(?:\.\d+)?) s")
# A phase this long gets the counting line (on a terminal only); shorter ones just print.
_COUNT_AFTER_S = 2.0
_BAR_WIDTH = 24


def phase_message(line: str) -> str | None:
    """The message of a worker's log line worth showing (its own INFO lines and any warning), or None."""
    line = line.strip()
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except ValueError:
            return None
        level, logger, msg = record.get("level"), str(record.get("logger", "")), record.get("msg")
    else:
        match = _TEXT_LINE.match(line)
        if match is None:
            return None
        level, logger, msg = match["level"], match["logger"], match["msg"]
    if not isinstance(msg, str) or not (logger.startswith("gpu_worker") or level in ("WARNING", "ERROR")):
        return None
    return msg


def bar(elapsed_s: float, estimate_s: float | None) -> str:
    """`12 s`, or against an estimate `[#########.........] 12 s of about 30 s`."""
    if not estimate_s:
        return f"{elapsed_s:.0f} s"
    done = min(1.0, elapsed_s / estimate_s)
    filled = round(done * _BAR_WIDTH)
    return f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {elapsed_s:.0f} s of about {estimate_s:.0f} s"


@dataclass
class _Log:
    name: str
    path: Path
    offset: int = 0
    partial: str = ""
    phase: str | None = None
    phase_at: float = 0.0


@dataclass
class StartupProgress:
    """Call `poll()` while waiting; `done()` once the wait is over."""

    logs: list[_Log] = field(default_factory=list)
    out: TextIO = field(default_factory=lambda: sys.stdout)
    _counting: bool = False  # the counting line is on screen, to be overwritten

    @classmethod
    def of(cls, workers: list[tuple[str, Path]], out: TextIO | None = None) -> StartupProgress:
        return cls([_Log(name, path) for name, path in workers], out or sys.stdout)

    def _new_lines(self, log: _Log) -> list[str]:
        try:
            with log.path.open("rb") as f:
                f.seek(log.offset)
                data = f.read()
        except OSError:
            return []
        log.offset += len(data)
        text = log.partial + data.decode(errors="replace")
        *lines, log.partial = text.split("\n")
        return lines

    def poll(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for log in self.logs:
            for line in self._new_lines(log):
                message = phase_message(line)
                if message is not None:
                    self._print(f"cbserve: {log.name}: {message}")
                    log.phase, log.phase_at = message, now
        if not self.out.isatty():
            return
        current = max((log for log in self.logs if log.phase), key=lambda log: log.phase_at, default=None)
        if current is None or current.phase is None or now - current.phase_at < _COUNT_AFTER_S:
            return
        estimate = _ESTIMATE.search(current.phase)
        counting = bar(now - current.phase_at, float(estimate[1]) if estimate else None)
        self.out.write(f"\r\033[K  {current.name}: {counting}")
        self.out.flush()
        self._counting = True

    def _print(self, text: str) -> None:
        if self._counting:
            self.out.write("\r\033[K")
            self._counting = False
        self.out.write(text + "\n")
        self.out.flush()

    def done(self) -> None:
        if self._counting:
            self.out.write("\r\033[K")
            self.out.flush()
            self._counting = False
