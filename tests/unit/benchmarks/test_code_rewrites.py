"""benchmarks/workloads/code_rewrites.py: a ShareGPT file of function rewrites that `--dataset sharegpt`
reads."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.workloads.code_rewrites import main

FUNCTION = '''def scale(values, factor=2):
    """Every value times factor, skipping the ones that are None, and the total of what is left."""
    kept = [v * factor for v in values if v is not None]
    total = 0
    for v in kept:
        total += v
    if not kept:
        raise ValueError("nothing left to scale once the missing values are skipped")
    return kept, total
'''


def test_each_function_becomes_a_rewrite_whose_reply_renames_it(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "mod.py").write_text(f"X = 1\n\n\n{FUNCTION}\n\ndef tiny(a):\n    return a\n")
    out = tmp_path / "rewrites.json"
    main([str(source), "-o", str(out)])
    [conversation] = json.loads(out.read_text())  # `tiny` is too short to rewrite
    ask, reply = (turn["value"] for turn in conversation["conversations"])
    assert FUNCTION.strip() in ask and "`values` renamed to `values_value`" in ask
    assert ask.endswith("```python\n")
    assert reply == FUNCTION.strip().replace("values", "values_value") + "\n```"
