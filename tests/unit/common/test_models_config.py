"""The models config file: several base models, each with cells of its own (common/models_config.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.models_config import cell_for, load_models_config, parse_models_config


def test_a_model_without_cells_gets_one_named_after_it(tmp_path: Path) -> None:
    config = parse_models_config(
        [
            {"model": str(tmp_path / "Llama-3"), "served_model_name": "org/Llama-3"},
            {"model": "x", "cells": ["a", "b"]},
        ],
        "test",
    )
    assert config.names == ["org/Llama-3", "x"]
    assert [m.placement_cells for m in config.models] == [["org-llama-3"], ["a", "b"]]
    assert cell_for("Qwen2.5_7B") == "qwen2-5-7b"


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([], "at least 1"),
        ([{"model": "a/m"}, {"model": "b/m"}], "two models are served as 'm'"),
        ([{"model": "a", "cells": ["c"]}, {"model": "b", "cells": ["c"]}], "cell 'c' would serve both"),
        ([{"model": "a", "cells": ["Bad_Cell"]}], "cell name 'Bad_Cell'"),
        ([{"model": "a", "extra": 1}], "extra: Extra inputs are not permitted"),
    ],
)
def test_a_config_that_cannot_be_served_is_refused_by_name(models: list[object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_models_config({"models": models}, "test")


def test_files_are_json_or_yaml_with_paths_from_their_folder(tmp_path: Path) -> None:
    (tmp_path / "models.json").write_text(json.dumps({"models": [{"model": "m1", "max_model_len": 64}]}))
    (tmp_path / "models.yaml").write_text("models:\n  - model: /abs/m2\n    served_model_name: two\n")
    from_json = load_models_config(tmp_path / "models.json")
    assert from_json.models[0].model == tmp_path / "m1"
    assert from_json.models[0].max_model_len == 64
    assert load_models_config(tmp_path / "models.yaml").models[0].model == Path("/abs/m2")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_models_config(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="cannot be read"):
        load_models_config(tmp_path / "missing.json")
