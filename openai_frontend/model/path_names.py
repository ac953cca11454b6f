"""The model directory's path as a name a request may give the model, besides its served name.

vLLM's default served name is the path it was given, and load-testing tools (guidellm, aiperf) load a
tokenizer from the model name they send: with `--model models/demo` they read the tokenizer on disk and
name the model the same way, where the served name (`demo`) would send them to the hub.
"""

from __future__ import annotations

import os
from pathlib import Path


def directory_names(model_dir: Path, cwd: Path) -> frozenset[str]:
    """`model_dir` absolute (as given and with links resolved) and, below `cwd`, relative to it."""
    absolutes = {Path(os.path.abspath(model_dir)), model_dir.resolve()}
    names = {str(path) for path in absolutes}
    for base in {Path(os.path.abspath(cwd)), cwd.resolve()}:
        names.update(str(path.relative_to(base)) for path in absolutes if path.is_relative_to(base))
    names.discard(".")  # the directory the server runs in is no model's name
    return frozenset(names)


def as_path_name(requested: str) -> str:
    """A requested name spelled as `directory_names` spells paths (`./models/demo/` is `models/demo`)."""
    return os.path.normpath(requested) if requested else requested
