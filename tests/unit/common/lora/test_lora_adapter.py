"""The adapter reader (common/lora/lora_adapter.py) on real PEFT adapters: what it reads from them, and each
refusal naming what is wrong (shapes of another base, rank, missing files, options it cannot serve),
without torch; then the gateway's check of an adapter (`check_adapter`), what fits runs and the rest
is refused with the reason."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from common.lora.lora_adapter import (
    TARGET_MODULES,
    WEIGHTS_FILE,
    BaseModelShapes,
    LoRAAdapterError,
    check_adapter,
    read_lora_adapter,
)
from harness.models.lora_adapters import build_lora_adapter

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def base(tiny_model_dir: Path) -> BaseModelShapes:
    return BaseModelShapes.read(tiny_model_dir)


def copy_of(adapter: Path, tmp_path: Path, **config: object) -> Path:
    """A copy of `adapter` with `config` merged into its adapter_config.json."""
    target = tmp_path / adapter.name
    shutil.copytree(adapter, target)
    path = target / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return target


def refusal(path: Path, base: BaseModelShapes, max_rank: int = 16) -> str:
    with pytest.raises(LoRAAdapterError) as caught:
        read_lora_adapter(path, base, max_rank)
    return str(caught.value)


def test_reads_ranks_targets_and_scalings(lora_adapters: dict[str, Path], base: BaseModelShapes) -> None:
    assert base.hidden_size == 64 and base.num_hidden_layers == 2 and base.head_dim == 16
    attn = read_lora_adapter(lora_adapters["attn-r4"], base, 16)
    assert attn.rank == 4 and attn.target_modules == {"q_proj", "v_proj"}
    assert [(m.layer, m.module) for m in attn.modules] == [
        (0, "q_proj"),
        (0, "v_proj"),
        (1, "q_proj"),
        (1, "v_proj"),
    ]
    assert all(m.scaling == 8 / 4 for m in attn.modules)
    mlp = read_lora_adapter(lora_adapters["mlp-rslora"], base, 16)
    scalings = {m.module: (m.rank, m.scaling) for m in mlp.modules}
    # rsLoRA: alpha / sqrt(r), with down_proj's own rank from rank_pattern.
    assert scalings == {
        "gate_proj": (8, 4 / math.sqrt(8)),
        "up_proj": (8, 4 / math.sqrt(8)),
        "down_proj": (2, 4 / math.sqrt(2)),
    }
    every = read_lora_adapter(lora_adapters["all-r16"], base, 16)
    assert every.rank == 16 and len(every.target_modules) == 7
    assert every.base_model_name_or_path is not None


def test_rank_above_max_lora_rank(lora_adapters: dict[str, Path], base: BaseModelShapes) -> None:
    message = refusal(lora_adapters["all-r16"], base, max_rank=8)
    assert "rank 16" in message and "max_lora_rank 8" in message


def test_another_base_models_shapes(lora_adapters: dict[str, Path], base: BaseModelShapes) -> None:
    wider = dataclasses.replace(base, hidden_size=128, intermediate_size=256, head_dim=32)
    message = refusal(lora_adapters["attn-r4"], wider)
    assert "layers.0.q_proj" in message and "another base model" in message and "[4, 64]" in message
    shallower = dataclasses.replace(base, num_hidden_layers=1)
    assert "past the base model's 1 layers" in refusal(lora_adapters["attn-r4"], shallower)
    fewer_kv = dataclasses.replace(base, num_key_value_heads=1)
    assert "v_proj" in refusal(lora_adapters["attn-r4"], fewer_kv)


def test_missing_files(lora_adapters: dict[str, Path], base: BaseModelShapes, tmp_path: Path) -> None:
    assert "no such directory" in refusal(tmp_path / "nowhere", base)
    no_config = copy_of(lora_adapters["attn-r4"], tmp_path)
    (no_config / "adapter_config.json").unlink()
    assert "no adapter_config.json" in refusal(no_config, base)
    pickled = copy_of(lora_adapters["mlp-rslora"], tmp_path)
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    assert "never the pickled adapter_model.bin" in refusal(pickled, base)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"bias": "all"}, "bias 'all'"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"lora_bias": True}, "lora_bias"),
        ({"fan_in_fan_out": True}, "fan_in_fan_out"),
        ({"peft_type": "IA3"}, "only LoRA adapters are supported, this one is IA3"),
        ({"target_modules": ["q_proj", "embed_tokens"]}, "unsupported target module 'embed_tokens'"),
        ({"r": 8}, "rank 4 but its config says r=8"),
        ({"lora_alpha": 0}, "lora_alpha must be a positive number"),
        ({"layers_to_transform": [1]}, "layers.0.q_proj is outside layers_to_transform [1]"),
        ({"rank_pattern": {"(": 2}}, "not a regular expression"),
    ],
)
def test_options_it_cannot_serve(
    lora_adapters: dict[str, Path],
    base: BaseModelShapes,
    tmp_path: Path,
    config: dict[str, object],
    expected: str,
) -> None:
    assert expected in refusal(copy_of(lora_adapters["attn-r4"], tmp_path, **config), base)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A file of zero-filled tensors: name -> (dtype, shape)."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        nbytes = math.prod(shape) * sizes[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def test_tensors_it_cannot_serve(
    lora_adapters: dict[str, Path], base: BaseModelShapes, tmp_path: Path
) -> None:
    adapter = copy_of(lora_adapters["attn-r4"], tmp_path)
    weights = adapter / "adapter_model.safetensors"
    prefix = "base_model.model.model.layers.0"
    q = {f"{prefix}.self_attn.q_proj.lora_A.weight": ("F32", [4, 64])}
    write_safetensors(weights, {**q, "base_model.model.lm_head.lora_A.weight": ("F32", [4, 64])})
    assert "unsupported tensor 'base_model.model.lm_head.lora_A.weight'" in refusal(adapter, base)
    write_safetensors(weights, q)
    assert "layers.0.q_proj has no lora_B tensor" in refusal(adapter, base)
    write_safetensors(weights, {**q, f"{prefix}.self_attn.q_proj.lora_B.weight": ("I32", [64, 4])})
    assert "is I32, not F32, F16 or BF16" in refusal(adapter, base)
    write_safetensors(weights, {f"{prefix}.mlp.q_proj.lora_A.weight": ("F32", [4, 64])})
    assert "unsupported target module mlp.q_proj" in refusal(adapter, base)
    write_safetensors(weights, {})
    assert "holds no LoRA factors" in refusal(adapter, base)


def test_malformed_weights_file(
    lora_adapters: dict[str, Path], base: BaseModelShapes, tmp_path: Path
) -> None:
    adapter = copy_of(lora_adapters["attn-r4"], tmp_path)
    weights = adapter / "adapter_model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])  # cut short: the data offsets run past the end
    assert "outside the file" in refusal(adapter, base)
    weights.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    assert "does not fit its" in refusal(adapter, base)
    weights.write_bytes(struct.pack("<Q", 5) + b"nope!")
    assert "not JSON" in refusal(adapter, base)


def test_reading_imports_no_torch(lora_adapters: dict[str, Path], tiny_model_dir: Path) -> None:
    """The gateway checks adapters with it, and the gateway never loads torch."""
    check = (
        "import sys\n"
        "from common.lora.lora_adapter import BaseModelShapes, read_lora_adapter\n"
        "read_lora_adapter(sys.argv[1], BaseModelShapes.read(sys.argv[2]), 16)\n"
        "print(sorted(m for m in ('torch', 'safetensors', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, str(lora_adapters["all-r16"]), str(tiny_model_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---- the gateway's check (`check_adapter`) ------------------------------------------------------


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
