"""Which base models `cbserve up` serves, and the cells whose batcher and workers serve each one.

One `--model`: as always, its cells named by --cells (`default`, or cell0, cell1, ...). Several
(`--model a --model b`, or `--models-config FILE`): a cell per model named after it (cell_for), or
--cells of them (`<cell>-0`, `<cell>-1`, ...), unless the config names its cells; the gateway and the
Celery worker are then handed one models config (common/models_config.py) holding every model's
resolved directory, written to the run directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cbserve.stack import cell_names
from common.models_config import ModelConfig, ModelsConfig, cell_for, load_models_config, parse_models_config

# What the gateway and the Celery worker are handed, in the run directory.
MODELS_FILE = "models.json"


@dataclass(frozen=True)
class ModelPlan:
    model_dir: Path  # resolved: the gateway and every worker of its cells read this directory
    cells: list[str]  # each a batcher and `workers` workers of this model
    workers: int  # per cell
    config: ModelConfig | None = None  # its entry of the models config (None: the one model)

    @property
    def name(self) -> str:
        return self.config.name if self.config is not None else self.model_dir.name


def plan_models(
    specs: Sequence[str] | None,
    models_config: Path | None,
    num_cells: int,
    workers: int,
    env: Mapping[str, str],
    resolve: Callable[[str], Path],
) -> list[ModelPlan]:
    """The plans; ValueError saying what to change. `resolve` turns a --model (a directory or a hub
    id) into a directory, `specs` None is the default model (MODEL, else the demo)."""
    if models_config is not None:
        if specs:
            raise ValueError("give the models as --model flags or in --models-config, not both")
        config = load_models_config(models_config)
    elif specs and len(specs) > 1:
        config = parse_models_config([{"model": str(resolve(spec))} for spec in specs], "--model")
    else:
        from cbserve.defaults import default_model

        spec = specs[0] if specs else default_model(env)
        return [ModelPlan(resolve(spec), cell_names(num_cells, env), workers)]
    plans = []
    for m in config.models:
        if not m.model.is_dir():
            raise ValueError(f"model {m.name!r}: no model directory at {m.model}")
        cells = m.cells or _cells_of(m.name, num_cells)
        resolved = m.model_copy(update={"model": m.model.resolve(), "cells": cells})
        plans.append(ModelPlan(resolved.model, cells, m.workers or workers, resolved))
    ModelsConfig(models=[p.config for p in plans if p.config is not None])  # cells stay apart
    return plans


def _cells_of(name: str, num_cells: int) -> list[str]:
    cell = cell_for(name)
    return [cell] if num_cells == 1 else [f"{cell[:29].rstrip('-')}-{i}" for i in range(num_cells)]


def write_models_file(plans: Sequence[ModelPlan], run_dir: Path) -> Path | None:
    """The models config the gateway and the Celery worker read (None for one model: its settings)."""
    if len(plans) == 1 and plans[0].config is None:
        return None
    entries = [p.config.model_dump(mode="json", exclude_none=True) for p in plans if p.config is not None]
    path = run_dir / MODELS_FILE
    path.write_text(json.dumps({"models": entries}, indent=2) + "\n")
    return path
