"""The base models one deployment serves, each in its own cell(s): the models config file.

One file (JSON, or YAML where PyYAML is installed) read by the gateway (GATEWAY_MODELS_CONFIG), the
Celery worker (CBSERVE_CELERY_MODELS_CONFIG) and `cbserve up --models-config`, so every process of a
deployment agrees on which model a name means and which cells serve it:

    {"models": [
      {"model": "models/llama", "served_model_name": "llama", "cells": ["llama"]},
      {"model": "models/qwen", "served_model_name": "qwen", "max_model_len": 4096}
    ]}

A model's cells are its own: a cell's batcher and workers serve one model, so no two models share a
cell. Without `cells`, a model gets one cell named after it (`cell_for`). The first model is the one
a request without `model` gets. Here only what a file says is checked; that a directory holds a
model is for its reader (the gateway loads its tokenizer, a worker its weights).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from common.streams import check_cell

# As a request's `model` is capped (openai_frontend/protocol/strings.py MAX_ID_CHARS).
MAX_NAME_CHARS = 256


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Path  # the model directory (config.json, weights, tokenizer.json)
    # The name clients pass as `model`; defaults to the directory's name.
    served_model_name: str | None = Field(default=None, min_length=1, max_length=MAX_NAME_CHARS)
    # The cells whose batcher and workers serve it; defaults to one named after the model.
    cells: list[str] = []
    # Longest prompt + output; defaults to config.json's context length.
    max_model_len: int | None = Field(default=None, gt=0)
    # The gateway's GATEWAY_TOOL_PARSER / GATEWAY_REASONING_PARSER for this model (None: those settings).
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    # `cbserve up`: worker processes per cell of this model (None: its --workers).
    workers: int | None = Field(default=None, gt=0)

    @field_validator("cells")
    @classmethod
    def _cell_names(cls, cells: list[str]) -> list[str]:
        for cell in cells:
            check_cell(cell)  # ValueError names the bad one
        if len(set(cells)) != len(cells):
            raise ValueError(f"cells {cells} lists a cell twice")
        return cells

    @property
    def name(self) -> str:
        return self.served_model_name or self.model.resolve().name

    @property
    def placement_cells(self) -> list[str]:
        return self.cells or [cell_for(self.name)]


class ModelsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[ModelConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> ModelsConfig:
        names = [m.name for m in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two models are served as {twice[0]!r}: give each its own served_model_name")
        owner: dict[str, str] = {}
        for m in self.models:
            for cell in m.placement_cells:
                if cell in owner:
                    raise ValueError(
                        f"cell {cell!r} would serve both {owner[cell]!r} and {m.name!r}: a cell's workers "
                        "hold one model, so give each model cells of its own"
                    )
                owner[cell] = m.name
        return self

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]


_NOT_CELL = re.compile(r"[^a-z0-9-]+")


def cell_for(name: str) -> str:
    """The cell a model without `cells` gets: its name in a cell name's letters (`Org/Llama-3` is
    `org-llama-3`), at most 32 of them."""
    cell = _NOT_CELL.sub("-", name.lower()).strip("-")[:32].strip("-")
    if not cell:
        raise ValueError(f"model {name!r} makes no cell name: give it `cells`")
    return cell


def parse_models_config(data: Any, source: str) -> ModelsConfig:
    """A config from parsed JSON/YAML: `{"models": [...]}`, or the list alone."""
    if isinstance(data, list):
        data = {"models": data}
    try:
        return ModelsConfig.model_validate(data)
    except ValidationError as exc:
        errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"models config {source}: {errors}") from None


def load_models_config(path: Path) -> ModelsConfig:
    """The file at `path`, JSON (or YAML, by its `.yaml` / `.yml` suffix); ValueError saying what is wrong.
    Relative model directories are read from the file's own folder, as a compose file's paths are."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"models config {path} cannot be read: {exc.strerror or exc}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(
                f"models config {path}: YAML needs PyYAML (pip install pyyaml), or write it as JSON"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"models config {path} is not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"models config {path} is not valid JSON: {exc}") from None
    config = parse_models_config(data, str(path))
    for m in config.models:
        if not m.model.is_absolute():
            m.model = path.parent / m.model
    return config
