"""A repetitive workload held out from `--dataset repetitive`'s templates: rewrite real functions.

    python -m benchmarks.workloads.code_rewrites common batcher -o /tmp/code-rewrites.json
    python -m benchmarks.serve compare --spec benchmarks/specs/cpu-speculative.toml \\
        --dataset sharegpt --dataset-path /tmp/code-rewrites.json

Every top-level function of the given folders' Python files (300-1,200 characters of source) becomes
one ShareGPT conversation: the function and the request to rename its first parameter, ending where
the answer starts; the reference reply is the renamed function, so the output length is the
rewrite's. A model that follows its prompt copies most of it.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
from pathlib import Path
from typing import Any

MIN_CHARS, MAX_CHARS = 300, 1200


def conversations(folders: list[Path], seed: int = 7) -> list[dict[str, Any]]:
    """One conversation per function, in a seeded order."""
    found = []
    for path in sorted(p for folder in folders for p in folder.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.parse(source).body:
            if not isinstance(node, ast.FunctionDef) or not node.args.args:
                continue
            code = ast.get_source_segment(source, node)
            if code is None or not MIN_CHARS < len(code) < MAX_CHARS:
                continue
            old = node.args.args[0].arg
            new = f"{old}_value"
            ask = (
                f"Here is a function from {path}:\n\n```python\n{code}\n```\n\n"
                f"Rewrite it with `{old}` renamed to `{new}`; change nothing else.\n\n```python\n"
            )
            turns = [
                {"from": "human", "value": ask},
                {"from": "gpt", "value": code.replace(old, new) + "\n```"},
            ]
            found.append({"conversations": turns})
    random.Random(seed).shuffle(found)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workloads.code_rewrites", description=__doc__)
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    found = conversations(args.folders)
    args.output.write_text(json.dumps(found), encoding="utf-8")
    print(f"{len(found)} conversations -> {args.output}")


if __name__ == "__main__":
    main()
