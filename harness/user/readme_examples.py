"""Code blocks of the docs, found by their `<!-- example: name -->` marker, run as users would run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from harness.processes.services import ROOT

RUNNERS = {"python": [sys.executable, "-c"], "bash": ["bash", "-euo", "pipefail", "-c"]}
MARKER = re.compile(r"<!-- example: ([\w-]+) -->\n```(\w+)\n")


def example(path: Path, name: str, lang: str = "python") -> str:
    """The fenced block right after `<!-- example: name -->` in a Markdown file."""
    match = re.search(rf"<!-- example: {name} -->\n```{lang}\n(.*?)\n```", path.read_text(), re.S)
    assert match, f"no {lang} example {name!r} in {path}"
    return match.group(1)


def examples_in(paths: list[Path]) -> dict[str, tuple[Path, str]]:
    """Every marked example of `paths`: name -> (file, language)."""
    found: dict[str, tuple[Path, str]] = {}
    for path in paths:
        for name, lang in MARKER.findall(path.read_text()):
            assert name not in found, f"example {name!r} is marked twice"
            found[name] = (path, lang)
    return found


def run_example(
    code: str,
    env: dict[str, str],
    lang: str = "python",
    python: Path | None = None,
    base_env: Mapping[str, str] | None = None,
) -> str:
    """Runs `code` from the repository root with `env` added to `base_env` (this process's environment
    by default); Python code with `python` (default: this interpreter)."""
    runner = [str(python), "-c"] if python is not None and lang == "python" else RUNNERS[lang]
    done = subprocess.run(
        [*runner, code],
        cwd=ROOT,
        env={**(os.environ if base_env is None else base_env), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
