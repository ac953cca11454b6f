"""The profiling step at the worker's step limits, and the limits the worker registers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.runner.profile import GIB, GpuMemoryBudget, build_profile_step
from gpu_worker.settings import WorkerSettings


def settings(model: str = "m", **kw: object) -> WorkerSettings:
    return WorkerSettings(model=model, worker_id="t", **kw)  # type: ignore[arg-type]


def test_step_spreads_the_token_budget_over_the_request_slots_in_blocks_of_their_own() -> None:
    step = build_profile_step(settings(max_num_seqs=3, max_num_batched_tokens=10, block_size=4), 512)
    so = step.scheduler_output
    assert [len(r.prompt_token_ids) for r in so.scheduled_new_reqs] == [4, 3, 3]
    assert so.total_num_scheduled_tokens == sum(so.num_scheduled_tokens.values()) == 10
    blocks = [b for r in so.scheduled_new_reqs for b in r.block_ids]
    assert sorted(blocks) == list(range(step.num_blocks)) == list(range(3))
    assert step.max_len == 4
    assert all(r.sampling_params.logprobs and r.sampling_params.has_penalties for r in so.scheduled_new_reqs)


def test_step_is_cut_where_no_request_could_be_longer() -> None:
    # 3 requests of at most 2 tokens (WORKER_MAX_MODEL_LEN) can never fill a 10-token step.
    step = build_profile_step(settings(max_num_seqs=3, max_num_batched_tokens=10, max_model_len=2), 512)
    assert step.scheduler_output.total_num_scheduled_tokens == 6 and step.max_len == 2
    step = build_profile_step(settings(max_num_seqs=3, max_num_batched_tokens=10), 3)
    assert step.scheduler_output.total_num_scheduled_tokens == 9


def test_limits_default_by_device_and_a_full_batch_of_decodes_must_fit() -> None:
    cpu, cuda = settings(), settings(device="cuda")
    assert (cpu.resolved_max_num_seqs, cpu.resolved_max_num_batched_tokens) == (64, 512)
    assert (cuda.resolved_max_num_seqs, cuda.resolved_max_num_batched_tokens) == (256, 8192)
    with pytest.raises(ValidationError, match="WORKER_MAX_NUM_BATCHED_TOKENS"):
        settings(max_num_seqs=16, max_num_batched_tokens=8)


def test_runner_profiles_its_own_limits_then_registers_them(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gpu_worker.runner.profile"):
        runner = ModelRunner(
            settings(str(tiny_model_dir), max_num_seqs=5, max_num_batched_tokens=48, num_blocks=20)
        )
    assert "profiling step: 5 requests, 48 tokens" in caplog.text
    info = runner.worker_info()
    assert (info.max_num_seqs, info.max_num_batched_tokens) == (5, 48)
    # The profile's requests are gone and the real pool replaced the temporary one.
    assert not runner.requests and runner.num_blocks == runner.kv_cache.num_blocks == 20
    assert runner.attn_backend.kv_cache is runner.kv_cache  # attention reads the real pool too


def test_worker_whose_largest_step_fails_refuses_to_start(tiny_model_dir: Path) -> None:
    # The profile's prompts are token 0: fault injection on it makes the worst-case step raise.
    with pytest.raises(ValueError, match=r"profiling step \(4 requests, 16 tokens\) failed"):
        ModelRunner(
            settings(str(tiny_model_dir), max_num_seqs=4, max_num_batched_tokens=16, fail_on_token_id=0)
        )


def test_gpu_kv_cache_gets_the_workers_share_of_total_memory_less_everything_else() -> None:
    budget = GpuMemoryBudget(
        total=100 * GIB,
        free_at_start=99 * GIB,
        utilization=0.9,
        weights=16 * GIB,
        activations=3 * GIB,
        non_torch=GIB,
        reserve=GIB,
    )
    assert budget.kv_cache() == 90 * GIB - 21 * GIB
    assert "weights 16.00, activations 3.00" in budget.describe()
    # Nothing left is 0 blocks (the loader then says which knob to turn), never a negative size.
    assert GpuMemoryBudget(100 * GIB, 99 * GIB, 0.2, 16 * GIB, 3 * GIB, GIB, GIB).kv_cache() == 0
    # A share that other processes already hold is refused up front, as vLLM does.
    with pytest.raises(ValueError, match=r"only 50\.0 GiB were free at startup"):
        GpuMemoryBudget(100 * GIB, 50 * GIB, 0.9, GIB, GIB, 0, 0).kv_cache()
