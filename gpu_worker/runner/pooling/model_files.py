"""What a pooling model is, read from its own files before any weight (with the settings of
gpu_worker/pooling_settings.py where they are not on auto): which runner serves it, how it pools,
whether it normalizes, its classifier's activation. A model the pooling path cannot run is refused
here, by name.

The sentence-transformers layout is read as sentence-transformers reads it: `modules.json` lists the
modules (a Transformer, then Pooling and Normalize); the Pooling module's `config.json` names its
mode (`pooling_mode`, or the older `pooling_mode_cls_token` / `pooling_mode_mean_tokens` /
`pooling_mode_lasttoken` flags); `sentence_bert_config.json` may cap the length (`max_seq_length`);
a CrossEncoder's activation is in `config_sentence_transformers.json` (`activation_fn`), or in
`config.json` for older ones, and is Sigmoid for one label and Identity for more when none is given,
as `CrossEncoder.get_default_activation_fn` decides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
from transformers import AutoConfig, PretrainedConfig

from common.protocol import PoolingParams, PoolingTask, WorkerInfo
from gpu_worker.runner.model_support import UnsupportedModelError, unsupported_features
from gpu_worker.settings import WorkerSettings

PoolingType = Literal["last", "mean", "cls"]
Activation = Literal["sigmoid", "softmax", "identity", "tanh"]
Runner = Literal["generate", "pooling"]

# Bidirectional encoders the encoder runner drives through transformers' AutoModel classes.
ENCODER_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra", "mpnet", "modernbert"}
)
# RoBERTa's positions start after the padding index: its last max_position_embeddings - (pad + 1).
_OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "camembert"})
_ST_POOLING = {"cls": "cls", "mean": "mean", "lasttoken": "last"}
_LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
_ACTIVATIONS: dict[str, Activation] = {
    "Sigmoid": "sigmoid",
    "Identity": "identity",
    "Tanh": "tanh",
    "Softmax": "softmax",
}


@dataclass(frozen=True, slots=True)
class PoolingSpec:
    """How the pooling runner serves one model."""

    model_dir: Path  # where its transformers files are (a sentence-transformers module's path)
    config: PretrainedConfig
    encoder: bool  # bidirectional: computed whole, by the encoder runner, without a KV cache
    classifier: bool  # classify/score through a head; else embed
    pooling_type: PoolingType
    normalize: bool  # embed's default
    score_activation: Activation  # what `score` applies to the logits (a CrossEncoder's activation)
    num_labels: int  # the head's outputs (0: embed)
    classifier_from_token: tuple[str, str] | None  # a decoder reranker's "no" and "yes" tokens
    max_seq_length: int | None  # a sentence-transformers length cap
    is_matryoshka: bool
    matryoshka_dimensions: tuple[int, ...]

    def params_of(self, params: PoolingParams | None) -> PoolingParams:
        """A request's pooling params; none (the profiling step's requests): the model's first task."""
        return PoolingParams(task=self.tasks[0]) if params is None else params

    @property
    def tasks(self) -> list[PoolingTask]:
        if not self.classifier:
            return ["embed"]
        return ["classify", "score"] if self.num_labels == 1 else ["classify"]

    def worker_info(self, info: WorkerInfo) -> WorkerInfo:
        """A runner's `info` as a pooling worker of this model announces it."""
        return msgspec.structs.replace(
            info,
            runner="pooling",
            pooling_tasks=self.tasks,
            # An encoder computes a prompt whole; only last-token pooling can reuse a cached prefix.
            chunked_prefill=not self.encoder,
            prefix_caching=not self.encoder and self.pooling_type == "last",
            embed_dim=0 if self.classifier else int(self.config.hidden_size),
            is_matryoshka=self.is_matryoshka,
            matryoshka_dimensions=list(self.matryoshka_dimensions),
        )


def resolve_runner(settings: WorkerSettings) -> Runner:
    """The runner `settings.runner` names, or on auto the one the model's files call for."""
    if settings.runner != "auto":
        return settings.runner
    if settings.convert != "auto":
        return "pooling"  # vLLM's --convert embed / classify implies --runner pooling
    root = Path(settings.model)
    if (root / "modules.json").is_file() or settings.classifier_from_token is not None:
        return "pooling"
    config = _read_json(root / "config.json")
    architectures = [str(a) for a in config.get("architectures") or []]
    if config.get("model_type") in ENCODER_TYPES:
        return "pooling"
    headless = [a for a in architectures if a.endswith("Model") and not a.endswith("LMHeadModel")]
    if headless or any(a.endswith("ForSequenceClassification") for a in architectures):
        return "pooling"  # a classifier, or a model saved without its LM head (an embedding model)
    return "generate"


def read_pooling_spec(settings: WorkerSettings) -> PoolingSpec:
    """The model's pooling spec; UnsupportedModelError naming what the pooling path cannot run."""
    root = Path(settings.model)
    modules = _read_modules(root)
    transformer_dir = root / modules.get("Transformer", "")
    config = AutoConfig.from_pretrained(transformer_dir)
    model_type = str(config.model_type)
    encoder = model_type in ENCODER_TYPES
    if not encoder:
        problems = unsupported_features(config)
        if problems:
            raise UnsupportedModelError(
                f"model type {model_type!r} cannot be served by the pooling runner: {'; '.join(problems)}. "
                f"Its encoders are {', '.join(sorted(ENCODER_TYPES))}; its decoders the causal LMs the "
                "worker generates with"
            )
    architectures = [str(a) for a in getattr(config, "architectures", None) or []]
    from_token = settings.classifier_from_token
    if from_token is not None and encoder:
        raise UnsupportedModelError("classifier_from_token applies to causal LMs, not to an encoder")
    classifier = settings.convert == "classify" or from_token is not None
    if settings.convert == "auto":
        classifier = classifier or any(a.endswith("ForSequenceClassification") for a in architectures)
    if (
        classifier
        and from_token is None
        and not any(a.endswith("ForSequenceClassification") for a in architectures)
    ):
        raise UnsupportedModelError(
            f"convert=classify needs a *ForSequenceClassification model or classifier_from_token; "
            f"{settings.model} is {', '.join(architectures) or model_type}"
        )
    num_labels = (1 if from_token is not None else int(config.num_labels)) if classifier else 0
    st_config = _read_json(root / "config_sentence_transformers.json")
    sbert = _read_json(transformer_dir / "sentence_bert_config.json")
    # A decoder's classifier reads its last token, whatever an embedding of it would pool.
    pooling_type = "last" if classifier and not encoder else _pooling_type(settings, root, modules, encoder)
    normalize = "Normalize" in modules if modules else True
    if settings.pooling_normalize is not None:
        normalize = settings.pooling_normalize
    matryoshka_dims = tuple(int(d) for d in getattr(config, "matryoshka_dimensions", None) or ())
    is_matryoshka = bool(getattr(config, "is_matryoshka", False) or matryoshka_dims)
    if settings.is_matryoshka is not None:
        is_matryoshka = settings.is_matryoshka
    max_seq_length = sbert.get("max_seq_length")
    return PoolingSpec(
        model_dir=transformer_dir,
        config=config,
        encoder=encoder,
        classifier=classifier,
        pooling_type=pooling_type,
        normalize=normalize,
        score_activation=_score_activation(config, st_config, num_labels, from_token is not None),
        num_labels=num_labels,
        classifier_from_token=None if from_token is None else (from_token[0], from_token[1]),
        max_seq_length=int(max_seq_length) if max_seq_length else None,
        is_matryoshka=is_matryoshka,
        matryoshka_dimensions=matryoshka_dims,
    )


def encoder_max_len(config: PretrainedConfig) -> int:
    """The longest input an encoder's position embeddings reach."""
    positions = int(config.max_position_embeddings)
    if config.model_type in _OFFSET_POSITIONS:
        positions -= int(config.pad_token_id or 0) + 1
    return positions


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _read_modules(root: Path) -> dict[str, str]:
    """A sentence-transformers model's modules by kind (Transformer, Pooling, Normalize) -> their path;
    empty for a plain transformers model. Any other module is refused by name."""
    path = root / "modules.json"
    if not path.is_file():
        return {}
    modules: dict[str, str] = {}
    for entry in json.loads(path.read_text()):
        kind = str(entry.get("type", "")).rsplit(".", 1)[-1]
        if kind not in ("Transformer", "Pooling", "Normalize"):
            raise UnsupportedModelError(
                f"sentence-transformers module {entry.get('type')!r} ({entry.get('path')}) is not supported: "
                "the pooling runner runs a Transformer followed by Pooling and Normalize modules"
            )
        modules[kind] = str(entry.get("path", ""))
    if "Transformer" not in modules:
        raise UnsupportedModelError(f"{path} lists no Transformer module")
    return modules


def _pooling_type(
    settings: WorkerSettings, root: Path, modules: dict[str, str], encoder: bool
) -> PoolingType:
    if settings.pooling_type != "auto":
        return settings.pooling_type
    if "Pooling" not in modules:
        return "cls" if encoder else "last"  # vLLM's defaults for BERT-like and causal embedding models
    config = _read_json(root / modules["Pooling"] / "config.json")
    mode: Any = config.get("pooling_mode")
    if mode is None:  # sentence-transformers before 6: one flag per mode
        modes = [name for key, name in _LEGACY_POOLING.items() if config.get(key)]
        mode = modes[0] if len(modes) == 1 else (modes or "mean")
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if not isinstance(mode, str) or mode not in _ST_POOLING:
        raise UnsupportedModelError(
            f"pooling mode {mode!r} ({root / modules['Pooling']}) is not supported: cls, mean or lasttoken"
        )
    pooling: PoolingType = _ST_POOLING[mode]  # type: ignore[assignment]
    return pooling


def _score_activation(
    config: PretrainedConfig, st_config: dict[str, Any], num_labels: int, from_token: bool
) -> Activation:
    if from_token:
        return "sigmoid"  # the two tokens' softmax, as a sigmoid of their logits' difference
    path = st_config.get("activation_fn")
    legacy = getattr(config, "sentence_transformers", None)
    if path is None and isinstance(legacy, dict):
        path = legacy.get("activation_fn")
    if path is None:
        path = getattr(config, "sbert_ce_default_activation_function", None)
    if path is None:
        return "sigmoid" if num_labels == 1 else "identity"
    name = str(path).rsplit(".", 1)[-1]
    if not str(path).startswith("torch.") or name not in _ACTIVATIONS:
        raise UnsupportedModelError(
            f"cross-encoder activation {path!r} is not supported: {sorted(_ACTIVATIONS)}"
        )
    return _ACTIVATIONS[name]
