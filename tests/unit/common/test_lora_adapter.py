"""PEFT adapters checked against their base model from their files alone: what fits runs, the rest
is refused with the reason (common/lora_adapter.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common.lora_adapter import TARGET_MODULES, WEIGHTS_FILE, check_adapter
from harness.models.lora_adapters import build_lora_adapter


@pytest.fixture(scope="module")
def adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_lora_adapter(tiny_model_dir, tmp_path_factory.mktemp("lora") / "a", rank=4, alpha=16)


def test_a_peft_adapter_of_the_base_model_is_read(adapter: Path, tiny_model_dir: Path) -> None:
    info = check_adapter(adapter, tiny_model_dir, max_lora_rank=8)
    assert (info.rank, info.lora_alpha, info.use_rslora) == (4, 16.0, False)
    assert info.target_modules == TARGET_MODULES
    assert info.scaling == 4.0
    assert check_adapter(adapter, tiny_model_dir, max_lora_rank=0).rank == 4  # 0: no limit


def test_a_rank_above_the_limit_is_refused(adapter: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="LoRA rank 4 is greater than max_lora_rank 2"):
        check_adapter(adapter, tiny_model_dir, max_lora_rank=2)


def test_missing_files_are_named(adapter: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"has no adapter_config\.json"):
        check_adapter(tmp_path, tiny_model_dir, 8)
    shutil.copy(adapter / "adapter_config.json", tmp_path)
    with pytest.raises(ValueError, match=f"has no {WEIGHTS_FILE}"):
        check_adapter(tmp_path, tiny_model_dir, 8)
    (tmp_path / WEIGHTS_FILE).write_bytes(b"\x00")
    with pytest.raises(ValueError, match="not a safetensors file"):
        check_adapter(tmp_path, tiny_model_dir, 8)


def test_an_adapter_of_another_base_is_refused(adapter: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 32, "head_dim": 8}))
    with pytest.raises(ValueError, match="trained for another base model"):
        check_adapter(adapter, tmp_path, 8)


def test_an_unsupported_target_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    head = build_lora_adapter(tiny_model_dir, tmp_path / "head", target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match="lm_head"):
        check_adapter(head, tiny_model_dir, 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"peft_type": "IA3"}, "only LoRA adapters"),
        ({"use_dora": True}, "DoRA is not supported"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"lora_alpha": 0}, "lora_alpha must be a positive number"),
    ],
)
def test_unsupported_kinds_are_refused(
    adapter: Path, tiny_model_dir: Path, tmp_path: Path, change: dict[str, object], message: str
) -> None:
    config = json.loads((adapter / "adapter_config.json").read_text())
    shutil.copy(adapter / WEIGHTS_FILE, tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=message):
        check_adapter(tmp_path, tiny_model_dir, 8)
