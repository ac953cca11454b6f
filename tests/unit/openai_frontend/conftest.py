"""The tiny model as the front end serves it, for tests that call the front end's functions directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from openai_frontend.model.path_names import directory_names
from openai_frontend.model.served_model import ModelRules, ServedModel
from openai_frontend.model.tokenizer import ModelTokenizer


@pytest.fixture(scope="session")
def tiny_served(tiny_model_dir: Path) -> ServedModel:
    """Named `tiny`, 512 tokens of context; its directory is a name too, as the gateway serves it."""
    rules = ModelRules(
        name="tiny", max_model_len=512, path_names=directory_names(tiny_model_dir, tiny_model_dir.parent)
    )
    return ServedModel(rules=rules, root=str(tiny_model_dir), tokenizer=ModelTokenizer(tiny_model_dir))
