"""A model the operator did not name answers to its directory's path too (as vLLM's default name is
the path), so that tools loading a tokenizer from the model name they send find it on disk."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.model_setup import load_served_model
from gateway.settings import GatewaySettings
from openai_frontend.generate.validation import check_model
from openai_frontend.model.path_names import directory_names
from openai_frontend.model.served_model import ServedModel
from openai_frontend.protocol.errors import OpenAIError


@pytest.fixture()
def model_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny model at `<tmp>/models/tiny`, the server started in `<tmp>`."""
    path = tmp_path / "models" / "tiny"
    shutil.copytree(tiny_model_dir, path)
    return path


def served_from(model_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str | None = None) -> ServedModel:
    monkeypatch.chdir(model_dir.parents[1])
    return load_served_model(GatewaySettings(model=model_dir, served_model_name=name))


def refused(requested: str, served: ServedModel) -> bool:
    try:
        check_model(requested, served)
    except OpenAIError as error:
        assert (error.status, error.param, error.code) == (404, "model", "model_not_found")
        return True
    return False


def test_the_directory_path_names_the_model(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = served_from(model_dir, monkeypatch)
    assert served.rules.name == "tiny"
    for name in ("tiny", "models/tiny", "./models/tiny/", str(model_dir), f"{model_dir}/"):
        assert not refused(name, served), name
    for name in ("models", "tiny/", "models/tin", "models/tiny/x", str(model_dir.parent), ".", "", "gpt-4"):
        assert refused(name, served), name


def test_a_relative_model_path_as_given(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(model_dir.parents[1])
    served = load_served_model(GatewaySettings(model=Path("models/tiny")))
    assert not refused("models/tiny", served)
    assert not refused(str(model_dir), served)


def test_an_operator_named_model_answers_to_that_name_alone(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = served_from(model_dir, monkeypatch, name="mine")
    assert not refused("mine", served)
    for name in ("tiny", "models/tiny", str(model_dir)):
        assert refused(name, served), name


def test_a_linked_directory_answers_to_both_paths(model_dir: Path, tmp_path: Path) -> None:
    link = tmp_path / "current"
    link.symlink_to(model_dir.parent)
    names = directory_names(link / "tiny", tmp_path)
    assert names == {str(link / "tiny"), "current/tiny", str(model_dir), "models/tiny"}


def test_a_model_outside_the_working_directory_has_only_its_absolute_path(model_dir: Path) -> None:
    assert directory_names(model_dir, model_dir / "sub") == {str(model_dir)}
    assert directory_names(model_dir, model_dir) == {str(model_dir)}
