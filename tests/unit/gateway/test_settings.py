"""GatewaySettings: env names, defaults, and errors that say what to change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from common.settings import DEFAULT_REDIS_URL
from gateway.model_setup import load_served_model
from gateway.settings import GatewaySettings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MODEL", "GATEWAY_MODEL", "REDIS_URL", "GATEWAY_SERVED_MODEL_NAME", "GATEWAY_MAX_MODEL_LEN"):
        monkeypatch.delenv(name, raising=False)


def test_defaults_from_model_dir(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL", str(tiny_model_dir))
    settings = GatewaySettings()
    assert settings.model == tiny_model_dir
    assert settings.model_name == tiny_model_dir.name
    assert settings.heartbeat_timeout_s == 5.0
    assert settings.redis_url == DEFAULT_REDIS_URL
    assert load_served_model(settings).rules.max_model_len == 512


def test_env_names(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("GATEWAY_SERVED_MODEL_NAME", "tiny")
    monkeypatch.setenv("GATEWAY_MAX_MODEL_LEN", "256")
    monkeypatch.setenv("GATEWAY_HEARTBEAT_TIMEOUT_S", "2.5")
    monkeypatch.setenv("REDIS_URL", "redis://example:1/2")
    settings = GatewaySettings()
    assert (settings.model_name, settings.max_model_len, settings.heartbeat_timeout_s) == ("tiny", 256, 2.5)
    assert settings.redis_url == "redis://example:1/2"
    assert load_served_model(settings).rules.max_model_len == 256
    # Constructor arguments (the CLI flags) win over the environment.
    assert GatewaySettings(served_model_name="other").model_name == "other"


def test_model_dir_without_tokenizer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="GATEWAY_MODEL"):
        GatewaySettings(model=tmp_path)


def test_missing_model_is_refused() -> None:
    with pytest.raises(ValidationError, match="MODEL"):
        GatewaySettings()


@pytest.mark.parametrize(
    ("field", "vllm_name", "ours"),
    [
        ("reasoning_parser", "deepseek_r1", "think"),
        ("reasoning_parser", "qwen3", "think"),
        ("reasoning_parser", "openai_gptoss", "harmony"),
        ("tool_parser", "openai", "harmony"),
        ("tool_parser", "qwen3_coder", "qwen3_xml"),
        ("tool_parser", "llama4_pythonic", "pythonic"),
    ],
)
def test_vllm_parser_names_are_ours(tiny_model_dir: Path, field: str, vllm_name: str, ours: str) -> None:
    overrides: dict[str, Any] = {field: vllm_name}
    settings = GatewaySettings(model=tiny_model_dir, **overrides)
    assert getattr(settings, field) == ours


def test_a_parser_we_do_not_have_is_refused_with_the_names_we_take(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="deepseek_r1"):
        GatewaySettings(model=tiny_model_dir, reasoning_parser="granite")


def test_a_models_config_names_every_model_and_its_cells(tiny_model_dir: Path, tmp_path: Path) -> None:
    from gateway.model_setup import load_served_models

    config = tmp_path / "models.json"
    entries = [
        {
            "model": str(tiny_model_dir),
            "served_model_name": "a",
            "max_model_len": 128,
            "reasoning_parser": "qwen3",
        },
        {"model": str(tiny_model_dir), "served_model_name": "b", "cells": ["b0", "b1"]},
    ]
    config.write_text(json.dumps({"models": entries}))
    settings = GatewaySettings(models_config=config, tool_parser="hermes")
    models = load_served_models(settings)
    assert models.names == ["a", "b"] and settings.model_name == "a"
    a, b = models.models
    assert (a.rules.max_model_len, a.rules.reasoning_parser, a.rules.tool_parser, a.rules.cells) == (
        128,
        "think",  # vLLM's name, ours
        "hermes",  # the gateway's own, for a model that sets none
        ("a",),
    )
    assert (b.rules.max_model_len, b.rules.cells) == (512, ("b0", "b1"))
    # One way to name the models: the file, or GATEWAY_MODEL (with its name and cells), not both.
    for clash in ({"model": tiny_model_dir}, {"served_model_name": "x"}, {"cells": "c"}):
        with pytest.raises(ValidationError, match="GATEWAY_MODELS_CONFIG"):
            GatewaySettings(models_config=config, **clash)
    config.write_text(json.dumps({"models": [{"model": str(tmp_path)}]}))
    with pytest.raises(ValidationError, match=r"containing tokenizer\.json"):
        GatewaySettings(models_config=config)
