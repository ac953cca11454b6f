"""Families with attention variants: greedy tokens equal `generate`.

Through transformers' forward with paged attention: Gemma 2 (softcapping, alternating windows), Gemma 3
(local layers with their own RoPE theta), gpt-oss (sinks, alternating windows, experts), Phi-3,
Qwen3-MoE; through the worker's decoder: Mistral v0.1 (one window), Qwen2 with sliding layers. Batched,
prefilled in chunks that cross the window, preempted and recomputed; a prefix-cache hit whose cached
blocks reach past the window, decoding beside its siblings through cascade attention's shared head;
the Triton kernels for the families with softcapping and sinks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, PreTrainedModel

from benchmarks.gpu.gpu_parity import reference_greedy
from common.protocol import CachedRequestData, SamplingParams
from gpu_worker.runner.attention.torch_attn import TorchAttentionMetadata
from gpu_worker.runner.forward.decoder import FAMILIES as DECODER_FAMILIES
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.runner.multimodal.vision_model import VisionLanguageModel
from harness.gpu_worker.worker_steps import new_request, scheduler_output
from harness.models.family_models import FAMILIES, WINDOW, save_family
from tests.unit.gpu_worker.test_decoder import greedy_requests_equal_generate
from tests.unit.gpu_worker.test_model_runner import (
    BLOCK_SIZE,
    generate_alone,
    make_requests,
    make_runner,
    run_to_completion,
)


@pytest.fixture(scope="module", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("attention-families")
    return {family: save_family(root / family, family) for family in FAMILIES}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_equals_generate(family: str, family_dirs: dict[str, Path]) -> None:
    runner = make_runner(family_dirs[family])
    own = AutoConfig.from_pretrained(family_dirs[family]).model_type in DECODER_FAMILIES
    # Gemma 3's image-text checkpoint is served as a vision-language model (multimodal/).
    assert isinstance(runner.model, Decoder if own else (PreTrainedModel, VisionLanguageModel))
    greedy_requests_equal_generate(runner, family_dirs[family])


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_the_variant_changes_the_tokens(family: str, family_dirs: dict[str, Path], tmp_path: Path) -> None:
    """The same weights without the window, softcap and sinks generate other tokens: the identity
    above holds because the backends implement them, not because they do not matter here."""
    config: Any = AutoConfig.from_pretrained(family_dirs[family])
    config.sliding_window = 512
    if family == "gemma2":
        config.attn_logit_softcapping = None
    plain = tmp_path / "plain"
    model: Any = reference_model(family_dirs[family], config)
    if family == "gpt_oss":
        for layer in model.model.layers:
            torch.nn.init.constant_(layer.self_attn.sinks, -1e4)  # exp(-1e4): no mass taken
    model.save_pretrained(plain)
    prompts = [r.prompt for r in make_requests([SamplingParams()] * 4)]
    assert reference_greedy(plain, prompts, 12) != reference_greedy(family_dirs[family], prompts, 12)


def reference_model(model_dir: Path, config: Any) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(model_dir, config=config)
    return model


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_triton_kernels_serve_softcapping_and_sinks(family: str, family_dirs: dict[str, Path]) -> None:
    runner = make_runner(
        family_dirs[family],
        worker_id="triton",
        attention_backend="triton",
        block_size=BLOCK_SIZE,
        # Room for the steps below, and no more: the profiling step at start-up is the largest step
        # allowed, and at the cpu defaults (64 requests, 512 tokens) Triton's interpreter takes ~20 s.
        max_num_seqs=6,
        max_num_batched_tokens=32,
    )
    max_tokens = [6, 3, 5, 4, 3]  # the first five requests of test_model_runner's mix
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in max_tokens]
    requests = make_requests(params)
    # r3's 40-token prompt takes two chunks (the second over cached context past the window).
    run_to_completion(runner, requests, preempt={4: "r0"})
    for req in requests:
        assert req.outputs == generate_alone(family_dirs[family], req.prompt, req.params.max_tokens), (
            req.req_id
        )


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "gpt_oss", "mistral"])
def test_prefix_hit_past_the_window_decodes_through_a_shared_head(
    family: str, family_dirs: dict[str, Path]
) -> None:
    """Request "a" computes a 41-token prompt; "b" and "c" share its first 9 blocks (36 tokens, five
    windows) and are admitted with them cached, as the batcher's prefix cache admits them. All three
    then decode together, the shared blocks read once by cascade attention."""
    model_dir = family_dirs[family]
    runner = make_runner(model_dir, worker_id="prefix", cascade_attention=True)
    shared_blocks = 9
    generator = torch.Generator().manual_seed(5)
    head = torch.randint(3, 500, (shared_blocks * BLOCK_SIZE,), generator=generator).tolist()
    prompts = {
        "a": head + torch.randint(3, 500, (5,), generator=generator).tolist(),
        "b": head + torch.randint(3, 500, (3,), generator=generator).tolist(),
        "c": head + torch.randint(3, 500, (6,), generator=generator).tolist(),
    }
    num_tokens = 8
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    head_ids = list(range(shared_blocks))
    blocks = {r: head_ids + [20 + 4 * i + j for j in range(4)] for i, r in enumerate(prompts)}
    got: dict[str, list[int]] = {r: [] for r in prompts}
    first = runner.execute_model(
        scheduler_output(
            0, [new_request("a", prompts["a"], params, blocks["a"])], [], {"a": len(prompts["a"])}
        )
    )
    got["a"] += first.sampled_token_ids
    cached_len = shared_blocks * BLOCK_SIZE
    assert cached_len > 4 * WINDOW
    joins = [
        new_request(r, prompts[r], params, blocks[r], num_computed_tokens=cached_len) for r in ("b", "c")
    ]
    out = runner.execute_model(
        scheduler_output(
            1,
            joins,
            [CachedRequestData(req_id="a", new_block_ids=[], num_computed_tokens=len(prompts["a"]))],
            {"a": 1} | {r: len(prompts[r]) - cached_len for r in ("b", "c")},
        )
    )
    plans = _record_plans(runner)
    step_id = 2
    while True:
        for r, t in zip(out.req_ids, out.sampled_token_ids, strict=True):
            got[r].append(t)
        live = [r for r in prompts if len(got[r]) < num_tokens]
        if not live:
            break
        cached = [
            CachedRequestData(
                req_id=r, new_block_ids=[], num_computed_tokens=len(prompts[r]) + len(got[r]) - 1
            )
            for r in live
        ]
        out = runner.execute_model(scheduler_output(step_id, [], cached, dict.fromkeys(live, 1)))
        step_id += 1
    assert any(plan.cascade is not None and plan.cascade.heads for plan in plans), "no shared head was read"
    for r, prompt in prompts.items():
        assert got[r] == generate_alone(model_dir, prompt, num_tokens), r


def _record_plans(runner: ModelRunner) -> list[TorchAttentionMetadata]:
    """Every step's torch-backend metadata from now on, to see that cascade attention ran."""
    backend: Any = runner.attn_backend
    plans: list[TorchAttentionMetadata] = []
    build = backend.build_metadata

    def recording(common: Any) -> TorchAttentionMetadata:
        plans.append(build(common))
        return plans[-1]

    backend.build_metadata = recording
    return plans
