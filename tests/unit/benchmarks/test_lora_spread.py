"""A spec's `lora_modules` spread a workload's requests over adapters, as vLLM bench's --lora-modules."""

from __future__ import annotations

from pathlib import Path

from benchmarks.load.runner import RunOptions, Target, build_inputs
from benchmarks.load.specs import load_spec_file, system_from_dict
from benchmarks.workloads.datasets import SampleRequest

ROOT = Path(__file__).resolve().parents[3]


def _models(target: Target, count: int) -> list[str]:
    requests = [SampleRequest([1, 2, 3], 4) for _ in range(count)]
    return [i.model for i in build_inputs(requests, target, "base", RunOptions(), None)]


def test_requests_name_each_adapter_in_turn() -> None:
    system = system_from_dict({"name": "lora", "base_url": "http://x", "lora_modules": ["a", "b", "c"]})
    target = Target("lora", "http://x", lora_modules=system.lora_modules)
    assert _models(target, 7) == ["a", "b", "c", "a", "b", "c", "a"]


def test_without_adapters_every_request_names_the_model() -> None:
    assert _models(Target("base", "http://x"), 3) == ["base", "base", "base"]


def test_the_lora_spec_spreads_over_the_adapters_its_server_loads() -> None:
    spec = load_spec_file(ROOT / "benchmarks/specs/cpu-lora.toml")
    lora = next(s for s in spec.systems if s.lora_modules)
    assert lora.launch is not None
    served = lora.launch.env["GATEWAY_LORA_MODULES"].split()
    assert [item.partition("=")[0] for item in served] == list(lora.lora_modules)
