"""LoRA through `LLM` (the scheduler and the model runner in this process): requests for three unlike
PEFT adapters and the base model, batched together (chunked prefill, more adapters than slots),
greedy tokens equal to PEFT's own unmerged `generate` for each request alone, in float32; preempted
requests keep their tokens; adapters refused before anything runs. Eager here; compiled in
tests/stack/lora/test_lora.py."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from cbserve import LLM, LoRARequest, SamplingParams
from common.lora.lora_adapter import LoRAAdapterError
from gpu_worker.runner.forward.decoder import Decoder
from harness.models.lora_adapters import peft_greedy
from tests.unit.cbserve.cpu_llm import cpu_llm

MAX_TOKENS = 10
PROMPT_LENS = [5, 40, 9, 17, 3, 26, 12, 7]
ADAPTER_OF = ["attn-r4", "mlp-rslora", "all-r16", None, "all-r16", "attn-r4", None, "mlp-rslora"]


def lora_prompts() -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(3, 500) for _ in range(n)] for n in PROMPT_LENS]


def expected_tokens(
    base: Path, adapters: dict[str, Path], prompts: list[list[int]], max_tokens: int = MAX_TOKENS
) -> list[list[int]]:
    """PEFT's generate for each prompt alone, with its adapter (or none)."""
    expected: list[list[int]] = [[] for _ in prompts]
    for name in {*ADAPTER_OF}:
        picked = [i for i, a in enumerate(ADAPTER_OF) if a == name]
        adapter = None if name is None else adapters[name]
        outs = peft_greedy(base, adapter, [prompts[i] for i in picked], max_tokens)
        for i, out in zip(picked, outs, strict=True):
            expected[i] = out
    return expected


def requests_of(adapters: dict[str, Path]) -> list[LoRARequest | None]:
    ids = {name: i + 1 for i, name in enumerate(sorted(adapters))}
    return [None if a is None else LoRARequest(a, ids[a], str(adapters[a])) for a in ADAPTER_OF]


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def expected(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> list[list[int]]:
    return expected_tokens(tiny_model_dir, lora_adapters, lora_prompts())


def mixed_llm(model_dir: Path, **overrides: Any) -> LLM:
    """Two slots for three adapters: requests wait for a slot while the base model's go on; a
    24-token budget chunks the long prompts."""
    settings: dict[str, Any] = {
        "num_blocks": 96,
        "block_size": 4,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 24,
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 16,
        "max_cpu_loras": 3,
    }
    return cpu_llm(model_dir, **{**settings, **overrides})


def generate_mixed(
    llm: LLM,
    adapters: dict[str, Path],
    picked: Sequence[int] = range(len(PROMPT_LENS)),
    max_tokens: int = MAX_TOKENS,
) -> list[list[int]]:
    """The `picked` prompts (all by default), each with its adapter (or the base model), in one call:
    their greedy tokens."""
    prompts, requests = lora_prompts(), requests_of(adapters)
    outputs = llm.generate(
        [{"prompt_token_ids": prompts[i]} for i in picked],
        greedy(max_tokens),
        use_tqdm=False,
        lora_request=[requests[i] for i in picked],
    )
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> Iterator[LLM]:
    yield mixed_llm(tiny_model_dir)


def test_mixed_adapters_in_one_batch_equal_peft_alone(
    llm: LLM, lora_adapters: dict[str, Path], expected: list[list[int]]
) -> None:
    assert generate_mixed(llm, lora_adapters) == expected
    assert len({tuple(e) for e in expected}) == len(expected)  # every adapter changed the output
    lora = llm.llm_engine.runner.lora
    assert lora is not None and lora.num_reads == 3  # each adapter read once (max_cpu_loras 3)
    assert lora.num_slot_loads >= 3  # three adapters through two slots: one took a slot in turn


def test_preempted_adapter_requests_keep_their_tokens(
    tiny_model_dir: Path, lora_adapters: dict[str, Path], expected: list[list[int]]
) -> None:
    # 80 tokens of KV for 8 requests of up to 50: requests are preempted.
    small = mixed_llm(tiny_model_dir, num_blocks=20, max_loras=3)
    assert generate_mixed(small, lora_adapters) == expected
    assert small.llm_engine.stats.num_preemptions > 0


def test_adapters_are_refused_before_anything_runs(
    llm: LLM, tiny_model_dir: Path, lora_adapters: dict[str, Path], tmp_path: Path
) -> None:
    prompt = [{"prompt_token_ids": [5, 6, 7]}]
    with pytest.raises(LoRAAdapterError, match="greater than max_lora_rank 8"):
        small_rank = cpu_llm(tiny_model_dir, num_blocks=16, enable_lora=True, max_lora_rank=8)
        small_rank.generate(
            prompt, greedy(), lora_request=LoRARequest("big", 1, str(lora_adapters["all-r16"]))
        )
    with pytest.raises(LoRAAdapterError, match="no such directory"):
        llm.generate(prompt, greedy(), lora_request=LoRARequest("gone", 9, str(tmp_path / "gone")))
    with pytest.raises(ValueError, match="2 lora_requests for 1 prompts"):
        llm.generate(prompt, greedy(), lora_request=[None, None])
    with pytest.raises(ValueError, match="lora_int_id must be > 0"):
        LoRARequest("zero", 0, str(lora_adapters["attn-r4"]))
    assert not llm.llm_engine.has_unfinished_requests()


def test_an_llm_without_enable_lora_refuses_an_adapter(
    tiny_model_dir: Path, lora_adapters: dict[str, Path]
) -> None:
    plain = cpu_llm(tiny_model_dir, num_blocks=16)
    assert plain.llm_engine.runner.worker_info().max_loras == 0
    with pytest.raises(ValueError, match="without enable_lora=True"):
        plain.generate([[5, 6]], greedy(), lora_request=LoRARequest("a", 1, str(lora_adapters["attn-r4"])))


def test_the_triton_kernels_in_the_decoder_equal_peft(
    tiny_model_dir: Path,
    lora_adapters: dict[str, Path],
    expected: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA path (Punica's shrink / expand behind `cbserve::lora_delta`) in the decoder, on the
    CPU under Triton's interpreter: the same tokens (a few prompts: the interpreter is slow)."""
    from gpu_worker.runner import load_model
    from gpu_worker.runner.lora.layers import LoRAConfig

    def triton_lora(settings: Any, device: torch.device) -> LoRAConfig:
        return LoRAConfig(settings.max_loras, settings.max_lora_rank, "triton")

    monkeypatch.setattr(load_model, "lora_config", triton_lora)
    llm = cpu_llm(tiny_model_dir, num_blocks=64, block_size=4, enable_lora=True, max_loras=3)
    decoder = llm.llm_engine.runner.model
    assert isinstance(decoder, Decoder) and decoder.lora_config is not None
    assert decoder.lora_config.kernel == "triton"
    picked = [0, 2, 3, 7]  # three adapters and the base model, in one batch
    tokens = generate_mixed(llm, lora_adapters, picked, max_tokens=4)
    assert tokens == [expected[i][:4] for i in picked]


def test_decode_graph_buffers_carry_each_rows_slot(
    tiny_model_dir: Path,
    lora_adapters: dict[str, Path],
    expected: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decode steps through the CUDA-graph path's padded static buffers (run eagerly on the CPU, with
    the triton attention backend it needs): each row's slot copied in, padding rows the base model's."""
    monkeypatch.setenv("WORKER_CUDA_GRAPHS", "true")
    monkeypatch.setenv("WORKER_ATTENTION_BACKEND", "triton")
    llm = cpu_llm(tiny_model_dir, num_blocks=64, block_size=4, max_num_seqs=3, enable_lora=True, max_loras=2)
    graphs = llm.llm_engine.runner.decode_graphs
    assert graphs is not None and graphs.lora_ids is not None
    picked = [0, 3, 7]  # two adapters and the base model: 3 rows, padded to a graph of 4
    tokens = generate_mixed(llm, lora_adapters, picked, max_tokens=4)
    assert graphs.num_replays > 0
    assert tokens == [expected[i][:4] for i in picked]
