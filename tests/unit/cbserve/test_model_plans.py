"""`cbserve up`'s models and their cells: one --model as always, several each in cells of its own
(cbserve/model_plans.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cbserve.model_plans import plan_models, write_models_file
from common.models_config import load_models_config


@pytest.fixture()
def dirs(tmp_path: Path) -> list[Path]:
    made = [tmp_path / "Llama-A", tmp_path / "qwen_b"]
    for path in made:
        path.mkdir()
    return made


def test_one_model_keeps_its_cells_and_needs_no_models_file(dirs: list[Path], tmp_path: Path) -> None:
    [plan] = plan_models([str(dirs[0])], None, 2, 1, {}, Path)
    assert (plan.model_dir, plan.cells, plan.config) == (dirs[0], ["cell0", "cell1"], None)
    assert write_models_file([plan], tmp_path) is None


def test_several_models_get_cells_named_after_them(dirs: list[Path], tmp_path: Path) -> None:
    plans = plan_models([str(d) for d in dirs], None, 1, 2, {}, Path)
    assert [(p.name, p.cells, p.workers) for p in plans] == [
        ("Llama-A", ["llama-a"], 2),
        ("qwen_b", ["qwen-b"], 2),
    ]
    assert [p.cells for p in plan_models([str(d) for d in dirs], None, 2, 1, {}, Path)] == [
        ["llama-a-0", "llama-a-1"],
        ["qwen-b-0", "qwen-b-1"],
    ]
    # What the gateway and the Celery worker read back: the same models, names and cells.
    path = write_models_file(plans, tmp_path)
    assert path is not None
    read = load_models_config(path)
    assert [(m.model, m.name, m.placement_cells) for m in read.models] == [
        (p.model_dir, p.name, p.cells) for p in plans
    ]


def test_a_config_names_cells_and_workers(dirs: list[Path], tmp_path: Path) -> None:
    config = tmp_path / "models.json"
    entries = [
        {"model": dirs[0].name, "served_model_name": "a", "cells": ["x", "y"], "workers": 3},
        {"model": str(dirs[1])},
    ]
    config.write_text(json.dumps({"models": entries}))
    plans = plan_models(None, config, 1, 1, {}, Path)
    assert [(p.name, p.model_dir, p.cells, p.workers) for p in plans] == [
        ("a", dirs[0], ["x", "y"], 3),
        ("qwen_b", dirs[1], ["qwen-b"], 1),
    ]
    with pytest.raises(ValueError, match="not both"):
        plan_models([str(dirs[0])], config, 1, 1, {}, Path)
    config.write_text(json.dumps({"models": [{"model": "missing"}]}))
    with pytest.raises(ValueError, match="no model directory"):
        plan_models(None, config, 1, 1, {}, Path)
