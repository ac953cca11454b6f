"""A classifier's label names, as vLLM's `/classify` answers them: the model config's `id2label`
(transformers writes `LABEL_0`, `LABEL_1`, ... when the model was saved without names)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from openai_frontend.pooling.inputs import transformer_dir


@functools.lru_cache(maxsize=8)
def class_labels(model_dir: Path) -> dict[int, str]:
    """Class index -> label, from the config of the model's Transformer module (its own folder but for
    an old sentence-transformers layout)."""
    path = transformer_dir(model_dir) / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    id2label = config.get("id2label") if isinstance(config, dict) else None
    if not isinstance(id2label, dict):
        return {}
    return {int(index): str(label) for index, label in id2label.items()}


def label_of(labels: dict[int, str], index: int) -> str:
    return labels.get(index, f"LABEL_{index}")
