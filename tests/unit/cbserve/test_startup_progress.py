"""`cbserve up` relays what its starting workers log (cbserve/startup_progress.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from cbserve.startup_progress import StartupProgress, bar, phase_message

LOADING = "2026-12-05 15:21:54,271 INFO gpu_worker.runner.load_model: loading the weights of models/demo"
COMPILING = (
    "2026-12-05 15:21:55,000 INFO gpu_worker.runner.forward.precompiled: "
    "compiling the forward, none cached: about 30 s"
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_worker_line_is_its_message_and_others_are_not_shown() -> None:
    assert phase_message(LOADING) == "loading the weights of models/demo"
    assert phase_message("2026-12-05 15:21:54,271 INFO torch._dynamo: tracing") is None
    assert phase_message("2026-12-05 15:21:54,271 WARNING torch._inductor: slow") == "slow"
    assert phase_message("Traceback (most recent call last):") is None
    record = {
        "ts": 1.0,
        "level": "INFO",
        "service": "gpu_worker",
        "logger": "gpu_worker.runner.profile",
        "msg": "p",
    }
    assert phase_message(json.dumps(record)) == "p"  # LOG_FORMAT=json
    assert phase_message("{not json") is None


def test_the_bar_fills_against_the_estimate() -> None:
    assert bar(12.4, None) == "12 s"
    assert bar(15, 30) == f"[{'#' * 12}{'.' * 12}] 15 s of about 30 s"
    assert bar(90, 30).startswith(f"[{'#' * 24}]")  # past its estimate: full, still counting


def test_lines_are_relayed_once_as_they_are_written(tmp_path: Path) -> None:
    log = tmp_path / "worker0.log"
    out = io.StringIO()  # not a terminal: lines only, no counting line
    progress = StartupProgress.of([("worker0", log)], out)
    progress.poll(now=0.0)  # no log yet
    log.write_text(LOADING + "\n" + COMPILING[:40])  # the second line is not complete yet
    progress.poll(now=1.0)
    assert out.getvalue() == "cbserve: worker0: loading the weights of models/demo\n"
    with log.open("a") as f:
        f.write(COMPILING[40:] + "\n")
    progress.poll(now=2.0)
    progress.poll(now=20.0)
    assert out.getvalue().splitlines() == [
        "cbserve: worker0: loading the weights of models/demo",
        "cbserve: worker0: compiling the forward, none cached: about 30 s",
    ]


def test_a_terminal_gets_a_counting_line_that_the_next_phase_replaces(tmp_path: Path) -> None:
    log = tmp_path / "worker0.log"
    log.write_text(COMPILING + "\n")
    out = Terminal()
    progress = StartupProgress.of([("worker0", log)], out)
    progress.poll(now=0.0)
    progress.poll(now=15.0)
    assert out.getvalue().endswith(f"\r\033[K  worker0: [{'#' * 12}{'.' * 12}] 15 s of about 30 s")
    with log.open("a") as f:
        f.write(LOADING + "\n")
    progress.poll(now=16.0)
    assert out.getvalue().endswith("\r\033[Kcbserve: worker0: loading the weights of models/demo\n")
    progress.done()
