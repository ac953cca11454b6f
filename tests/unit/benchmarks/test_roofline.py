"""The roofline of a decode step: bytes and flops from the model's shape, each system's precision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.bounds.roofline import Machine, ModelShape, bound_for, decode_context, precision_of, roofline
from benchmarks.load.specs import system_from_dict
from benchmarks.workloads.datasets import SampleRequest

CONFIG = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "dtype": "float32",
}


def _request(prompt_len: int, output_len: int) -> SampleRequest:
    return SampleRequest(prompt_token_ids=[5] * prompt_len, output_len=output_len)


def test_a_decode_step_reads_every_layer_and_the_lm_head_but_not_the_embedding() -> None:
    shape = ModelShape.from_config(CONFIG)
    assert shape.decoder.head_dim == 16
    # Per layer: q and o 64x64 each, k and v 64x32 each, gate/up/down 64x128 each; then the 512x64 head.
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
    assert shape.weights_read == 2 * per_layer + 512 * 64


def test_the_bound_is_the_slower_of_memory_and_compute() -> None:
    shape = ModelShape.from_config(CONFIG)
    weights = shape.weights_read
    fp32 = precision_of(system_from_dict({"name": "ours", "launch": {"kind": "cbserve"}}), shape)
    assert (fp32.weight_bytes, fp32.kv_bytes) == (4.0, 4.0)
    batch, context = 4, 10.0
    kv_bytes = batch * context * 2 * 2 * 2 * 16 * 4.0
    flops = 2 * weights * batch + 4 * 2 * 4 * 16 * context * batch
    memory_bound = Machine(threads=2, copy_gb_s=1e-6, gemm_gflop_s=1e6)  # bytes dominate
    bound = bound_for("ours", shape, fp32, memory_bound, batch, context, 0, 100, measured_tok_s=2.0)
    step_s = (weights * 4.0 + kv_bytes) / 1e3
    assert bound.step_mb == pytest.approx((weights * 4.0 + kv_bytes) / 1e6)
    assert bound.decode_tok_s == pytest.approx(batch / step_s)
    assert bound.decode_fraction == pytest.approx(2.0 / (batch / step_s))
    compute_bound = Machine(threads=2, copy_gb_s=1e6, gemm_gflop_s=1e-6)  # flops dominate
    bound = bound_for("ours", shape, fp32, compute_bound, batch, context, 50, 100, num_requests=4)
    assert bound.decode_tok_s == pytest.approx(batch / (flops / 1e3))
    # The 4 prompts (50 tokens) need the LM head for their last tokens only, and give the first 4 tokens.
    prompt_s = (2 * (weights - 512 * 64) * 50 + 2 * 512 * 64 * 4) / 1e3
    assert bound.workload_tok_s == pytest.approx(100 / (prompt_s + (100 - 4) / batch * flops / 1e3))
    assert bound.decode_fraction is None


def test_each_system_reads_its_own_bytes_per_weight() -> None:
    shape = ModelShape.from_config(CONFIG)
    systems = {
        "q8": {"kind": "llama-server", "outtype": "q8_0"},
        "f32": {"kind": "llama-server", "outtype": "f32", "kv_type": "f32"},
        "int8": {"kind": "cbserve", "env": {"WORKER_QUANTIZATION": "int8"}},
        "bf16": {"kind": "static", "dtype": "bfloat16"},
        "bf16-kv": {"kind": "cbserve", "env": {"WORKER_KV_CACHE_DTYPE": "bfloat16"}},
        "int8-f16-kv": {
            "kind": "cbserve",
            "env": {"WORKER_QUANTIZATION": "int8", "WORKER_KV_CACHE_DTYPE": "float16"},
        },
    }
    got = {
        name: precision_of(system_from_dict({"name": name, "launch": launch}), shape)
        for name, launch in systems.items()
    }
    assert (got["q8"].weight_bytes, got["q8"].kv_bytes) == (34 / 32, 2.0)  # llama.cpp's f16 KV cache
    assert (got["f32"].weight_bytes, got["f32"].kv_bytes) == (4.0, 4.0)
    assert (got["int8"].weight_bytes, got["int8"].kv_bytes) == (1.0, 4.0)
    assert (got["bf16"].weight_bytes, got["bf16"].kv_bytes) == (2.0, 2.0)
    assert (got["bf16-kv"].weight_bytes, got["bf16-kv"].kv_bytes) == (4.0, 2.0)
    assert (got["int8-f16-kv"].weight_bytes, got["int8-f16-kv"].kv_bytes) == (1.0, 2.0)
    assert got["int8-f16-kv"].name == "int8 weights, float16 KV"


def test_the_context_is_the_mean_over_output_tokens() -> None:
    # Request A decodes 2 tokens at contexts 10 and 11; B decodes 1 at context 4.
    requests = [_request(10, 2), _request(4, 1)]
    assert decode_context(requests) == pytest.approx((10 + 11 + 4) / 3)


def test_roofline_reads_the_model_config_and_pairs_each_system_with_its_measurement(tmp_path: Path) -> None:
    model = tmp_path
    (model / "config.json").write_text(json.dumps(CONFIG))
    systems = [
        system_from_dict({"name": "peer", "launch": {"kind": "llama-server", "outtype": "q8_0"}}),
        system_from_dict({"name": "ours", "launch": {"kind": "cbserve"}}),
    ]
    machine = Machine(threads=2, copy_gb_s=10.0, gemm_gflop_s=50.0)
    bounds = roofline(model, systems, {"ours": 3.0}, machine, 4, [_request(10, 2), _request(4, 1)])
    assert [b.system for b in bounds] == ["peer", "ours"]
    assert bounds[0].measured_tok_s is None and bounds[1].measured_tok_s == 3.0
    assert bounds[0].step_mb < bounds[1].step_mb  # q8_0 weights and an f16 cache read fewer bytes
