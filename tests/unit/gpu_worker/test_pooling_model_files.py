"""Which runner a model gets and how it pools, read from its own files as sentence-transformers reads
them; what the pooling path cannot run is refused at load, by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import BertConfig, BloomConfig, Qwen2Config

from gpu_worker.runner.model_support import UnsupportedModelError
from gpu_worker.runner.pooling.model_files import read_pooling_spec, resolve_runner
from gpu_worker.settings import WorkerSettings

ST_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]


def model_dir(tmp_path: Path, config: Any, files: dict[str, Any] | None = None) -> Path:
    config.save_pretrained(tmp_path)
    for name, content in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps(content))
    return tmp_path


def settings(path: Path, **kw: Any) -> WorkerSettings:
    return WorkerSettings(model=str(path), **kw)


def bert(**kw: Any) -> BertConfig:
    return BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, **kw)


def qwen2(architectures: list[str]) -> Qwen2Config:
    return Qwen2Config(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        architectures=architectures,
    )


def test_the_runner_follows_the_models_files_unless_set(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert resolve_runner(settings(tiny_model_dir)) == "generate"
    assert resolve_runner(settings(tiny_model_dir, runner="pooling")) == "pooling"
    assert resolve_runner(settings(tiny_model_dir, classifier_from_token=["no", "yes"])) == "pooling"
    # vLLM's --convert embed serves a chat model's own hidden states: it implies the pooling runner.
    assert resolve_runner(settings(tiny_model_dir, convert="embed")) == "pooling"
    spec = read_pooling_spec(settings(tiny_model_dir, convert="embed"))
    assert (spec.encoder, spec.pooling_type, spec.normalize, spec.tasks) == (False, "last", True, ["embed"])
    assert resolve_runner(settings(model_dir(tmp_path / "b", bert()))) == "pooling"
    headless = model_dir(tmp_path / "q", qwen2(["Qwen2Model"]))
    assert resolve_runner(settings(headless)) == "pooling"
    assert resolve_runner(settings(headless, runner="generate")) == "generate"
    classifier = model_dir(tmp_path / "c", qwen2(["Qwen2ForSequenceClassification"]))
    assert resolve_runner(settings(classifier)) == "pooling"


def test_sentence_transformers_pooling_modes_old_and_new(tmp_path: Path) -> None:
    legacy = {
        "word_embedding_dimension": 32,
        "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False,
    }
    files = {"modules.json": ST_MODULES, "1_Pooling/config.json": legacy}
    spec = read_pooling_spec(settings(model_dir(tmp_path / "old", bert(), files)))
    assert (spec.encoder, spec.pooling_type, spec.normalize, spec.tasks) == (True, "cls", False, ["embed"])
    files = {
        "modules.json": [*ST_MODULES, {"idx": 2, "path": "2_Normalize", "type": "x.Normalize"}],
        "1_Pooling/config.json": {"embedding_dimension": 32, "pooling_mode": "lasttoken"},
        "sentence_bert_config.json": {"max_seq_length": 64},
    }
    spec = read_pooling_spec(settings(model_dir(tmp_path / "new", qwen2(["Qwen2Model"]), files)))
    assert (spec.encoder, spec.pooling_type, spec.normalize, spec.max_seq_length) == (False, "last", True, 64)
    # Without sentence-transformers files: vLLM's defaults, overridable.
    plain = model_dir(tmp_path / "plain", bert())
    assert read_pooling_spec(settings(plain)).pooling_type == "cls"
    assert read_pooling_spec(settings(plain, pooling_type="mean", pooling_normalize=False)).normalize is False


def test_what_the_pooling_runner_cannot_run_is_refused_by_name(tmp_path: Path) -> None:
    files = {"modules.json": ST_MODULES, "1_Pooling/config.json": {"pooling_mode": "max"}}
    with pytest.raises(UnsupportedModelError, match="pooling mode 'max'"):
        read_pooling_spec(settings(model_dir(tmp_path / "max", bert(), files)))
    dense = [*ST_MODULES, {"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]
    with pytest.raises(UnsupportedModelError, match=r"sentence_transformers\.models\.Dense"):
        read_pooling_spec(settings(model_dir(tmp_path / "dense", bert(), {"modules.json": dense})))
    with pytest.raises(UnsupportedModelError, match=r"model type 'bloom' cannot be served.*ALiBi"):
        read_pooling_spec(settings(model_dir(tmp_path / "bloom", BloomConfig(n_layer=1, hidden_size=32))))
    with pytest.raises(UnsupportedModelError, match="classifier_from_token applies to causal LMs"):
        read_pooling_spec(settings(model_dir(tmp_path / "b", bert()), classifier_from_token=["no", "yes"]))


def test_a_cross_encoders_activation_is_read_where_sentence_transformers_keeps_it(tmp_path: Path) -> None:
    one_label = bert(num_labels=1, architectures=["BertForSequenceClassification"])
    spec = read_pooling_spec(settings(model_dir(tmp_path / "default", one_label)))
    assert (spec.classifier, spec.tasks, spec.score_activation) == (True, ["classify", "score"], "sigmoid")
    identity = {
        "config_sentence_transformers.json": {"activation_fn": "torch.nn.modules.activation.Identity"}
    }
    spec = read_pooling_spec(settings(model_dir(tmp_path / "v6", one_label, identity)))
    assert spec.score_activation == "identity"
    legacy = bert(
        num_labels=1,
        architectures=["BertForSequenceClassification"],
        sentence_transformers={"activation_fn": "torch.nn.modules.activation.Tanh"},
    )
    assert read_pooling_spec(settings(model_dir(tmp_path / "v4", legacy))).score_activation == "tanh"
    three = bert(num_labels=3, architectures=["BertForSequenceClassification"])
    spec = read_pooling_spec(settings(model_dir(tmp_path / "three", three)))
    assert (spec.tasks, spec.score_activation) == (["classify"], "identity")


def test_matryoshka_from_the_config_or_the_setting(tmp_path: Path) -> None:
    path = model_dir(tmp_path / "m", bert(matryoshka_dimensions=[8, 16]))
    spec = read_pooling_spec(settings(path))
    assert (spec.is_matryoshka, spec.matryoshka_dimensions) == (True, (8, 16))
    assert read_pooling_spec(settings(path, is_matryoshka=False)).is_matryoshka is False
