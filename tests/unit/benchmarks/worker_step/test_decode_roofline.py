"""benchmarks/worker_step/decode_roofline.py times the worker's own forward: the Decoder that gpu_worker's
load_model builds, by the same calls, its forward timed apart from the step's host time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.worker_step import decode_roofline
from benchmarks.worker_step.forward_timer import ForwardTimer
from gpu_worker.runner import load_model
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.settings import WorkerSettings


def _settings(model: str, compile_: bool) -> WorkerSettings:
    return WorkerSettings(model=model, device="cpu", compile=compile_, compile_cache_dir="/tmp/cbserve-x")


def test_the_forward_is_built_as_load_model_builds_it(tiny_model_dir: Path, monkeypatch) -> None:
    calls: list[tuple[Any, Path, torch.device]] = []

    def compile_decoder(decoder: Decoder, cache_dir: Path, device: torch.device) -> None:
        calls.append((type(decoder), cache_dir, device))

    monkeypatch.setattr(load_model, "compile_decoder", compile_decoder)
    loaded = load_model.load_model(_settings(str(tiny_model_dir), compile_=True))
    assert len(calls) == 1  # the worker's
    built = decode_roofline.worker_forward(
        decode_roofline.build_model("tiny", torch.device("cpu"), torch.float32), _settings("x", True)
    )
    assert type(loaded) is type(built) is Decoder
    assert len(calls) == 2 and calls[0] == calls[1]  # the benchmark's, as the worker's
    eager = decode_roofline.worker_forward(
        decode_roofline.build_model("tiny", torch.device("cpu"), torch.float32), _settings("x", False)
    )
    assert isinstance(eager, Decoder) and eager.run == eager.logits_of
    assert decode_roofline.describe_forward(eager) == "Decoder (eager)"
    assert len(calls) == 2


def test_each_step_is_timed_whole_and_its_forward_apart() -> None:
    settings = WorkerSettings(
        model="<in-memory tiny>", device="cpu", compile=False, block_size=16, num_blocks=16, max_num_seqs=4
    )
    model = decode_roofline.worker_forward(
        decode_roofline.build_model("tiny", torch.device("cpu"), torch.float32), settings
    )
    runner = ModelRunner(settings, model=model)
    timer = ForwardTimer(runner)
    times = decode_roofline.time_decode(runner, timer, batch=4, context=24, warmup=1, steps=3, step_id=0)
    assert len(times.step_ms) == len(times.forward_ms) == 3
    for step_ms, forward_ms in zip(times.step_ms, times.forward_ms, strict=True):
        assert 0 < forward_ms < step_ms
    assert timer.take() == []  # every forward was taken by its step
    result = decode_roofline.decode_result(4, 24, times, weights=10**6, kv=10**5, bandwidth=1e10)
    assert result.host_ms > 0 and result.step_bandwidth_fraction < result.bandwidth_fraction


def test_main_reports_the_worker_forward_and_both_times(tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    sizes = ["--shape", "tiny", "--batches", "1,2", "--context", "20", "--warmup", "1", "--steps", "2"]
    device = ["--device", "cpu", "--dtype", "float32", "--env", "compile=false"]
    decode_roofline.main([*sizes, *device, "--result-file", str(out)])
    summary = json.loads(out.read_text())
    assert summary["forward"] == "Decoder (eager)"
    assert summary["forward_timer"] == "perf_counter"
    assert [row["batch"] for row in summary["decode"]] == [1, 2]
    row = summary["decode"][0]
    assert row["forward_ms"] < row["step_ms"]
    assert row["weight_bytes"] > 0 and row["kv_bytes"] > 0


@pytest.mark.parametrize("name", ["llama3-8b", "llama-1b"])
def test_the_gpu_shapes_are_llama_family_decoders(name: str) -> None:
    shape = decode_roofline.SHAPES[name]
    heads, kv_heads = shape.num_attention_heads, shape.num_key_value_heads
    assert shape.hidden_size % heads == 0 and heads % kv_heads == 0 and shape.num_hidden_layers > 0
