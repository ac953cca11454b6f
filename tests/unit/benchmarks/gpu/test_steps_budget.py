"""benchmarks/gpu/steps.sh: each step's limit comes from what the budget has left, less the run's ending
and the limits reserved for later steps; what ran, how long, and what was skipped go to steps.tsv."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def _run(tmp_path: Path, script: str, **env: str) -> tuple[str, list[list[str]]]:
    work = tmp_path / "work"
    work.mkdir()
    prelude = f"RESULT_DIR={tmp_path / 'results'} WORK={work}; source benchmarks/gpu/steps.sh\n"
    done = subprocess.run(
        ["bash", "-c", prelude + script],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    steps = work / "steps.tsv"
    rows = [line.split("\t") for line in steps.read_text().splitlines()] if steps.exists() else []
    return done.stdout, rows


def test_a_step_may_not_spend_what_later_steps_reserved(tmp_path: Path) -> None:
    out, rows = _run(
        tmp_path,
        'BUDGET_S=100 TAIL_S=10; reserve "b:30" "c:20"\n'
        "step a 90 true; step b 30 true; step c 20 true; step d 90 true\n",
    )
    limits = {name: int(limit) for name, limit, _seconds, _rc in rows}
    # a: 100 - 10 (tail) - 30 - 20 (reserved) = 40; b and c keep their own; d gets what is left: 90
    # less the seconds a, b and c took (whole seconds, more on a loaded machine), and what they
    # reserved no longer counts against it.
    assert limits["a"] == 40
    assert (limits["b"], limits["c"]) == (30, 20)
    assert 40 < limits["d"] <= 90
    assert [rc for *_, rc in rows] == ["0", "0", "0", "0"]
    assert "start a (limit 40s)" in out


def test_a_step_is_skipped_once_too_little_is_left_and_recorded(tmp_path: Path) -> None:
    out, rows = _run(
        tmp_path, "BUDGET_S=40 TAIL_S=10; reserve 'b:20'\nstep a 60 true; step b 20 false; true\n"
    )
    assert rows[0] == ["a", "0", "0", "skipped"]  # 40 - 10 - 20 = 10 < STEP_MIN_LEFT_S
    assert rows[1][0] == "b" and rows[1][1] == "20" and rows[1][3] == "1"
    # 10s, less the whole seconds that passed since the budget started (a second's edge may fall between).
    left = re.search(r"skip a \(budget spent: (\d+)s left to it\)", out)
    assert left is not None and 8 <= int(left.group(1)) <= 10, out


def test_steps_not_asked_for_reserve_nothing(tmp_path: Path) -> None:
    _out, rows = _run(
        tmp_path, "BUDGET_S=100 TAIL_S=0; reserve 'b:50'\nstep a 100 true; step b 50 true\n", STEPS="a"
    )
    assert [(name, limit) for name, limit, *_ in rows] == [("a", "100")]


def test_a_skipped_step_gives_back_its_reservation(tmp_path: Path) -> None:
    _out, rows = _run(
        tmp_path, "BUDGET_S=100 TAIL_S=0; reserve 'b:50'\nskip b 'no launcher'; step a 100 true\n"
    )
    assert rows[0] == ["b", "0", "0", "skipped"]
    # b's 50 s came back: a gets the whole 100, less one second if a clock second turned since the
    # budget started (whole seconds, as `date +%s` counts them).
    name, limit, _seconds, rc = rows[1]
    assert (name, rc) == ("a", "0") and int(limit) in (99, 100)
