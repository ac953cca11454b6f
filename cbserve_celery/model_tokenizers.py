"""The tokenizers a Celery worker renders text with: CBSERVE_CELERY_MODEL's one, or one per model of
CBSERVE_CELERY_MODELS_CONFIG (the gateway's models config, common/models_config.py), each loaded on
first use (after the prefork pool forked).

A batch's lines are rendered by the rules the gateway kept with the batch, each with this worker's
tokenizer of the model it names: a worker of one tokenizer runs batches of one model, as before; a
worker of a models config runs the lines of every model it names, and fails the others' lines saying so.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from common.models_config import ModelsConfig
from openai_frontend.model.served_model import ModelRules, ServedModel
from openai_frontend.model.served_models import ServedModels
from openai_frontend.model.tokenizer import ModelTokenizer
from openai_frontend.model.vision_processor import VisionProcessor, load_vision_processor


class ModelTokenizers:
    def __init__(self, single: Path | None, config: ModelsConfig | None) -> None:
        self._single = single
        self._dirs = {m.name: m.model for m in config.models} if config is not None else {}
        self._cells = {m.name: m.placement_cells for m in config.models} if config is not None else {}
        self._lock = threading.Lock()
        self._loaded: dict[Path, ModelTokenizer] = {}
        self._processors: dict[Path, VisionProcessor | None] = {}

    def _load(self, model_dir: Path) -> ModelTokenizer:
        with self._lock:
            if model_dir not in self._loaded:
                self._loaded[model_dir] = ModelTokenizer(model_dir)
            return self._loaded[model_dir]

    def _served(self, rules: ModelRules, model_dir: Path) -> ServedModel:
        """`rules`' model with this worker's tokenizer of it, and its processor when it reads images."""
        return ServedModel(rules, str(model_dir), self._load(model_dir), vision=self.vision(model_dir))

    def model_dir(self, model: str | None = None) -> Path | None:
        """The directory of `model` (None: CBSERVE_CELERY_MODEL's, else the config's first); None when
        this worker has none for it."""
        if model is None:
            return self._single or next(iter(self._dirs.values()), None)
        return self._dirs.get(model)

    def vision(self, model_dir: Path) -> VisionProcessor | None:
        """The processor of the vision-language model at `model_dir` (loaded once); None: text only."""
        with self._lock:
            if model_dir not in self._processors:
                self._processors[model_dir] = load_vision_processor(model_dir)
            return self._processors[model_dir]

    def tokenizer(self, model: str | None = None) -> ModelTokenizer | None:
        """`model`'s tokenizer (None: the worker's one or first); None when it has none for it."""
        model_dir = self.model_dir(model)
        return None if model_dir is None else self._load(model_dir)

    def served(self, model: str | None = None) -> ServedModel | None:
        """`model` (None: the worker's one or first) as the pooling bodies read a model: its name,
        directory and tokenizer; None when the worker has no tokenizer for it."""
        model_dir = self.model_dir(model)
        if model_dir is None:
            return None
        # Only the name is read of the rules: the gateway's limits are the batcher's to apply here.
        rules = ModelRules(name=model or model_dir.name, max_model_len=0)
        return ServedModel(rules, str(model_dir), self._load(model_dir))

    def cells(self, model: str | None) -> list[str]:
        """The cells of a model of the config (None: the first; empty: unknown, or no config)."""
        if model is None and self._single is None:
            model = next(iter(self._cells), None)
        return list(self._cells.get(model or "", []))

    def knows(self, model: str) -> bool:
        return model in self._dirs

    def runs(self, model: str) -> bool:
        """A worker of one model runs whatever base model it is named; one of a config, its models."""
        return not self._dirs or model in self._dirs

    def for_batch(self, models: Sequence[ModelRules]) -> tuple[ServedModels | None, frozenset[str]]:
        """The batch's models this worker can render, and the names of those it cannot; None for the
        first when it can render none of them."""
        if not self._dirs:
            if self._single is None or len(models) != 1:
                return None, frozenset(m.name for m in models)
            return ServedModels([self._served(models[0], self._single)]), frozenset()
        served = [self._served(r, self._dirs[r.name]) for r in models if r.name in self._dirs]
        unserved = frozenset(r.name for r in models if r.name not in self._dirs)
        return (ServedModels(served) if served else None), unserved

    def missing_message(self, models: Sequence[ModelRules]) -> str:
        """Why `for_batch` found nothing to render the batch with."""
        names = ", ".join(m.name for m in models)
        if not self._dirs and self._single is None:
            return (
                "this Celery worker has no tokenizer: start it with CBSERVE_CELERY_MODEL (or MODEL) set to "
                "the model directory the gateway serves, or CBSERVE_CELERY_MODELS_CONFIG"
            )
        if not self._dirs:
            return (
                f"the gateway serves several models ({names}) and this Celery worker one tokenizer: start "
                "it with CBSERVE_CELERY_MODELS_CONFIG, the gateway's models config"
            )
        return f"this Celery worker's CBSERVE_CELERY_MODELS_CONFIG names none of the batch's models ({names})"
