"""Code blocks of the docs, found by their `<!-- example: name -->` marker, run as users would run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.harness.services import ROOT

RUNNERS = {"python": [sys.executable, "-c"], "bash": ["bash", "-euo", "pipefail", "-c"]}


def example(path: Path, name: str, lang: str = "python") -> str:
    """The fenced block right after `<!-- example: name -->` in a Markdown file."""
    match = re.search(rf"<!-- example: {name} -->\n```{lang}\n(.*?)\n```", path.read_text(), re.S)
    assert match, f"no {lang} example {name!r} in {path}"
    return match.group(1)


def run_example(code: str, env: dict[str, str], lang: str = "python") -> str:
    """Runs `code` from the repository root with `env` added to this process's environment."""
    done = subprocess.run(
        [*RUNNERS[lang], code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
