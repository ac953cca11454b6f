"""The worker's adapters (gpu_worker/runner/lora/manager.py) in a ModelRunner: a request whose adapter
cannot be served fails alone with the reason while the rest of its step runs; a worker without LoRA
refuses one; host memory and device slots are least-recently-used caches; the slots' memory is the
runner's and what it announces says how many adapters it serves."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest
import torch
from pydantic import ValidationError

from common.protocol import LoRARequest, NewRequestData, SamplingParams
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.settings import WorkerSettings
from harness.gpu_worker.worker_steps import new_request, prefill_step
from tests.unit.gpu_worker.test_model_runner import make_runner

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def runner(tiny_model_dir: Path) -> ModelRunner:
    return make_runner(tiny_model_dir, enable_lora=True, max_loras=2, max_cpu_loras=2, max_lora_rank=16)


def lora(adapters: dict[str, Path], name: str) -> LoRARequest:
    return LoRARequest(lora_name=name, lora_path=str(adapters[name]))


def with_lora(req_id: str, blocks: list[int], adapter: LoRARequest | None) -> NewRequestData:
    return msgspec.structs.replace(new_request(req_id, [5, 6, 7, 8, 9], GREEDY, blocks), lora_request=adapter)


def test_announces_its_adapters_and_owns_the_slots(runner: ModelRunner) -> None:
    info = runner.worker_info()
    assert (info.max_loras, info.max_lora_rank, info.max_cpu_loras) == (2, 16, 2)
    lora = runner.lora
    assert lora is not None and len(lora.layers) == 2
    group = lora.layers[0].qkv
    assert group.lora_a.shape == (2, 3 * 16, 64) and [b.shape for b in group.lora_b] == [
        (2, 16, 64),
        (2, 16, 32),
        (2, 16, 32),
    ]
    with pytest.raises(
        ValidationError, match=r"WORKER_MAX_CPU_LORAS \(2\) must be at least WORKER_MAX_LORAS \(3\)"
    ):
        WorkerSettings(model="m", enable_lora=True, max_loras=3, max_cpu_loras=2)


def test_an_adapter_that_cannot_be_served_fails_its_request_alone(
    runner: ModelRunner, lora_adapters: dict[str, Path], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(lora_adapters["attn-r4"], broken)
    (broken / "adapter_model.safetensors").unlink()
    step = prefill_step(
        [
            with_lora("ok", [0, 1], lora(lora_adapters, "attn-r4")),
            with_lora("gone", [2, 3], LoRARequest(lora_name="gone", lora_path=str(broken))),
            with_lora("base", [4, 5], None),
        ]
    )
    out = runner.execute_model(step)
    assert out.req_ids == ["ok", "base"]
    assert "LoRA adapter 'gone' cannot be served" in out.req_errors["gone"]
    assert "no adapter_model.safetensors" in out.req_errors["gone"]
    runner.reset()


def test_a_worker_without_lora_refuses_an_adapter(
    tiny_model_dir: Path, lora_adapters: dict[str, Path]
) -> None:
    plain = make_runner(tiny_model_dir)
    assert plain.lora is None and plain.worker_info().max_loras == 0
    out = plain.execute_model(prefill_step([with_lora("a", [0, 1], lora(lora_adapters, "attn-r4"))]))
    assert out.req_ids == [] and "serves no adapters" in out.req_errors["a"]


def test_host_memory_and_slots_are_lru(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> None:
    manager = make_runner(tiny_model_dir, enable_lora=True, max_loras=2, max_cpu_loras=2).lora
    assert manager is not None
    a, b, c = (lora(lora_adapters, name) for name in ("attn-r4", "mlp-rslora", "all-r16"))
    for adapter in (a, b, c, a):
        assert manager.add(adapter) is None
    assert manager.num_reads == 4  # two in host memory: a was dropped for c, and read again
    first = manager.slots_for([a, b])  # b read again (c dropped)
    assert sorted(first.values()) == [0, 1]
    second = manager.slots_for([c, a])  # b, the one this step does not use, gives c its slot
    assert second == {c.cache_key: first[b.cache_key], a.cache_key: first[a.cache_key]}
    assert (manager.num_reads, manager.num_slot_loads) == (6, 3)
    assert manager.slots_for([a]) == {a.cache_key: first[a.cache_key]} and manager.num_slot_loads == 3
    with pytest.raises(ValueError, match="a step uses 3 LoRA adapters but this worker has 2 slots"):
        manager.slots_for([a, b, c])
