"""The worker's own decoder (gpu_worker/runner/forward/), eager: merged GEMMs, each family, quantized weights.

At fp32 it must give the very tokens transformers' `generate` gives, for each family it serves,
through batching, chunked prefill and preemption; quantized weights are close, not equal. The
compiled decoder: tests/stack/services/test_compiled_forward.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from common.protocol import SamplingParams
from gpu_worker.runner.forward.compile import compile_decoder
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.forward.linear import Linear
from gpu_worker.runner.model_runner import ModelRunner
from harness.gpu_worker.worker_steps import new_request, prefill_step
from harness.models.family_models import SMALL
from tests.unit.gpu_worker.test_model_runner import (
    generate_alone,
    make_requests,
    make_runner,
    run_to_completion,
)

MAX_TOKENS = [12, 5, 20, 8, 15, 3, 10, 18, 7, 9, 6]


@pytest.fixture(scope="module", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


def _save(path: Path, model_class: type[PreTrainedModel], config: PretrainedConfig) -> Path:
    torch.manual_seed(0)
    model_class(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A random model of each family but Llama (tiny_model_dir): Qwen3's q/k norms and explicit
    head_dim, Qwen2's q/k/v biases, Mistral."""
    root = tmp_path_factory.mktemp("families")
    return {
        "qwen3": _save(root / "qwen3", Qwen3ForCausalLM, Qwen3Config(**SMALL, head_dim=32)),
        "qwen2": _save(root / "qwen2", Qwen2ForCausalLM, Qwen2Config(**SMALL)),
        "mistral": _save(root / "mistral", MistralForCausalLM, MistralConfig(**SMALL, sliding_window=None)),
    }


def greedy_requests_equal_generate(runner: ModelRunner, model_dir: Path) -> None:
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in MAX_TOKENS]
    requests = make_requests(params)
    # Chunked prefill (a 40-token prompt at a 24-token budget), steps of one token and one row at the
    # end, and r0 preempted mid-decode and resumed.
    run_to_completion(runner, requests, preempt={8: "r0"})
    for req in requests:
        assert req.outputs == generate_alone(model_dir, req.prompt, req.params.max_tokens), req.req_id


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "mistral"])
def test_each_family_equals_generate(family: str, family_dirs: dict[str, Path]) -> None:
    runner = make_runner(family_dirs[family], compile=False)
    assert isinstance(runner.model, Decoder)
    greedy_requests_equal_generate(runner, family_dirs[family])


def test_other_architectures_run_transformers_forward(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=512)
    model_dir = _save(tmp_path / "gpt2", GPT2LMHeadModel, config)
    runner = make_runner(model_dir, compile=True)
    assert isinstance(runner.model, PreTrainedModel)
    with pytest.raises(ValueError, match="WORKER_QUANTIZATION=int8 is implemented for llama"):
        make_runner(model_dir, quantization="int8")


def test_merged_gemms_read_the_checkpoints_weights(tiny_model_dir: Path) -> None:
    hf = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    decoder = Decoder(hf, None)
    layer: Any = hf.model.layers[1]
    attn, mlp = layer.self_attn, layer.mlp
    # The weight as the layer multiplies by it, whatever its stored layout: x = I gives W^T exactly.
    qkv, gate_up = decoder.layers[1].qkv_proj, decoder.layers[1].gate_up_proj
    with torch.inference_mode():
        merged = qkv(torch.eye(qkv.in_features)).t()
        merged_mlp = gate_up(torch.eye(gate_up.in_features)).t()
    assert torch.equal(merged, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert torch.equal(merged_mlp, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))


def test_fp32_weights_are_packed_for_onednn_on_the_cpu(tiny_model_dir: Path) -> None:
    hf = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    decoder = Decoder(hf, None)
    assert all(lin.packed for lin in decoder.modules() if isinstance(lin, Linear))
    x = torch.randn(5, hf.config.hidden_size)
    with torch.inference_mode():
        torch.testing.assert_close(decoder.lm_head(x), hf.lm_head(x), rtol=1e-5, atol=1e-5)


def _first_logits(runner: ModelRunner, prompt: list[int]) -> torch.Tensor:
    """The logits of the prompt's next token (a prefill step, read back through logprobs)."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    step = prefill_step([new_request("r", prompt, params, list(range(16)))])
    runner._apply(step, {})
    batch = runner._scheduled(step, {})
    from gpu_worker.runner.input_batch import build_input_batch

    with torch.inference_mode():
        return runner._forward(build_input_batch(batch, runner.attn_backend, runner.device))[0].clone()


@pytest.mark.parametrize("quantization", ["int8", "fp8"])
def test_quantized_weights_stay_close(tiny_model_dir: Path, quantization: Any) -> None:
    prompt = list(range(3, 40))
    exact = _first_logits(make_runner(tiny_model_dir, compile=False), prompt)
    quantized = _first_logits(make_runner(tiny_model_dir, compile=False, quantization=quantization), prompt)
    assert not torch.equal(exact, quantized)  # the weights really are quantized
    cosine = torch.nn.functional.cosine_similarity(exact, quantized, dim=0)
    assert cosine > 0.99, cosine
    assert exact.topk(5).indices[0] in quantized.topk(5).indices


def _failing_backend(*args: Any) -> Any:
    raise RuntimeError("no compiler here")


def test_a_failed_compile_leaves_the_model_eager(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiling ahead fails, then compiling at the first call: the model runs eagerly, correctly."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # restored after the test
    runner = make_runner(tiny_model_dir, compile=False)
    decoder = runner.model
    assert isinstance(decoder, Decoder)
    with caplog.at_level(logging.WARNING):
        compile_decoder(decoder, tmp_path, torch.device("cpu"), backend=_failing_backend)
        greedy_requests_equal_generate(runner, Path(runner.model_name))
    assert "cannot compile the forward ahead" in caplog.text
    assert "torch.compile failed, running eager" in caplog.text
    assert decoder.run == decoder.logits_of
    assert not list(tmp_path.glob("precompiled/*.bin"))
