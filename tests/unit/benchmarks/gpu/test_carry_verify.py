"""benchmarks/gpu/carry/carry_verify.py, the GPU run's first step: it names the first module that fails to
import (and exits 1), and reports host packages that miss what the lock left to them."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu.carry import carry_verify


def test_the_first_module_that_fails_to_import_is_named() -> None:
    failed = carry_verify.first_failed_import(("json", "cbserve_no_such_module", "also_missing"))
    assert failed is not None
    assert failed.startswith("cbserve_no_such_module (ModuleNotFoundError: ")
    assert carry_verify.first_failed_import(("json", "packaging.requirements")) is None


def test_an_older_or_missing_host_package_and_a_wrong_carried_version_are_reported() -> None:
    lock = {
        "host": {
            "packaging": ["packaging>=1 (from cbserve)", "packaging>=999 (from x)"],
            "cbserve-no-such-dist": ["cbserve-no-such-dist (from y)"],
            "pytest": ["pytest>=1; sys_platform == 'nonexistent' (from z)"],
        },
        "carry": [{"name": "packaging", "version": "0.0.1"}],
    }
    problems = carry_verify.host_problems(lock)
    assert len(problems) == 2
    assert problems[0].startswith("packaging>=999 (from x): this host has packaging ")
    assert problems[1] == "cbserve-no-such-dist (from y): cbserve-no-such-dist is not installed here"
    assert carry_verify.carried_problems(lock)[0].endswith("found, the carried 0.0.1 expected")


def test_main_stops_with_status_1_naming_the_module(tmp_path: Path, monkeypatch, capsys) -> None:
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"host": {}, "carry": [], "assumed": ["packaging"]}))
    monkeypatch.setattr(carry_verify, "MODULES", ("json", "cbserve_no_such_module"))
    assert carry_verify.main(["--lock", str(lock)]) == 1
    assert "cannot import cbserve_no_such_module (ModuleNotFoundError" in capsys.readouterr().err
    monkeypatch.setattr(carry_verify, "MODULES", ("json",))
    assert carry_verify.main(["--lock", str(lock)]) == 0
