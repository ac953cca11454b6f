"""Every project file a comment or a document names by its path exists: a move updates its mentions.

A path counts when it starts at a top-level folder of the repository (`gpu_worker/runner/kv_cache.py`,
`docs/api.md`); the tests themselves are left out (they write made-up paths on purpose).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_FOLDERS = (
    "batcher",
    "benchmarks",
    "cbserve",
    "cbserve_celery",
    "common",
    "docs",
    "gateway",
    "gpu_worker",
    "harness",
    "openai_frontend",
    "scripts",
    "tests",
)
_PATH = re.compile(
    rf"(?<![\w/.-])((?:{'|'.join(_FOLDERS)})/[\w/.-]*\w\.(?:py|md|sh|toml|cpp|json|jinja|txt))"
)
_READ = (".py", ".md", ".sh", ".toml", ".yml", ".yaml", "Makefile", "Dockerfile")
# Written by a run, not kept in the repository.
_OUTPUTS = ("docs/results/",)


def _files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [f for f in listed.stdout.split() if f.endswith(_READ) and not f.startswith("tests/")]


def test_every_named_path_exists() -> None:
    missing = [
        f"{name}:{number}: {path}"
        for name in _files()
        for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
        for path in _PATH.findall(line)
        if not (ROOT / path).exists() and not path.startswith(_OUTPUTS)
    ]
    assert not missing, "\n".join(missing)
