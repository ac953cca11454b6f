"""Prompt logprobs from the prefill's own forward, chunked or not, equal transformers' log_softmax."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from common.protocol import (
    CachedRequestData,
    PromptEvent,
    SamplingParams,
    TokenEvent,
)
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.runner.sample import prompt_logprobs
from gpu_worker.settings import WorkerSettings
from harness.gpu_worker.worker_steps import new_request, scheduler_output

BLOCK_SIZE = 4
PROMPTS = {
    "a": [462, 383, 46, 427, 255, 274, 170, 352, 12, 99, 3],
    "b": [17, 42, 99, 5, 300, 301, 8],
}
TOL = 1e-4  # fp32 on both sides; the paged attention sums in another order


@pytest.fixture(scope="module", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def runner(tiny_model_dir: Path) -> ModelRunner:
    settings = WorkerSettings(
        model=str(tiny_model_dir), num_blocks=32, block_size=BLOCK_SIZE, worker_id="test", seed=0
    )
    return ModelRunner(settings)


def reference(model_dir: Path, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, vocab]: transformers' log_softmax at each prompt position but the last."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0].float()
    return logits.log_softmax(-1)[:-1]


def run(runner: ModelRunner, params: SamplingParams, chunks: dict[str, list[int]]) -> list[object]:
    """Each prompt computed in the given chunk sizes, all in the same steps; the events of every step."""
    events: list[object] = []
    blocks = {"a": list(range(0, 4)), "b": list(range(8, 12))}
    done = dict.fromkeys(PROMPTS, 0)
    step = 0
    while any(done[r] < len(PROMPTS[r]) for r in PROMPTS):
        new, cached, scheduled = [], [], {}
        for r, sizes in chunks.items():
            if step >= len(sizes):
                continue
            if step == 0:
                new.append(new_request(r, PROMPTS[r], params, blocks[r], attempt=1))
            else:
                cached.append(CachedRequestData(req_id=r, new_block_ids=[], num_computed_tokens=done[r]))
            scheduled[r] = sizes[step]
            done[r] += sizes[step]
        out = runner.execute_model(scheduler_output(step, new, cached, scheduled))
        assert not out.req_errors
        events += runner.token_events(out)
        step += 1
    runner.reset()
    return events


@pytest.mark.parametrize(
    ("chunks", "rows_per_slice"),
    [({"a": [11], "b": [7]}, 256), ({"a": [11], "b": [7]}, 4), ({"a": [3, 5, 3], "b": [1, 6]}, 256)],
    ids=["whole-prompts", "log-softmax-in-slices", "chunked-prefill"],
)
def test_prompt_logprobs_equal_transformers(
    runner: ModelRunner,
    tiny_model_dir: Path,
    chunks: dict[str, list[int]],
    rows_per_slice: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prompt_logprobs, "_ROWS_PER_SLICE", rows_per_slice)
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3)
    events = run(runner, params, chunks)
    prompt_events = {e.req_id: e for e in events if isinstance(e, PromptEvent)}
    assert set(prompt_events) == set(PROMPTS)
    for req_id, prompt in PROMPTS.items():
        event = prompt_events[req_id]
        ref = reference(tiny_model_dir, prompt)
        expected = ref.gather(1, torch.tensor(prompt[1:]).unsqueeze(1)).squeeze(1)
        assert event.token_ids == prompt
        assert event.finish_reason is None
        torch.testing.assert_close(torch.tensor(event.logprobs), expected, atol=TOL, rtol=0)
        top_values, top_ids = ref.topk(3, dim=-1)
        torch.testing.assert_close(torch.tensor(event.top_logprobs), top_values, atol=TOL, rtol=0)
        assert event.top_token_ids == top_ids.tolist()
        # The prompt event comes first, then the request's tokens as usual.
        mine = [e for e in events if getattr(e, "req_id", None) == req_id]
        assert isinstance(mine[0], PromptEvent) and isinstance(mine[1], TokenEvent)


def test_max_tokens_zero_ends_at_the_prompt_without_a_token(runner: ModelRunner) -> None:
    params = SamplingParams(max_tokens=0, temperature=0.0, prompt_logprobs=0)
    events = run(runner, params, {"a": [4, 7], "b": [7]})
    assert all(isinstance(e, PromptEvent) for e in events)
    assert sorted(e.req_id for e in events if isinstance(e, PromptEvent)) == ["a", "b"]
    for e in events:
        assert isinstance(e, PromptEvent)
        assert e.finish_reason == "length"
        assert len(e.logprobs) == len(PROMPTS[e.req_id]) - 1
        assert e.top_token_ids == [[]] * len(e.logprobs)


def test_requests_without_prompt_logprobs_send_no_prompt_event(runner: ModelRunner) -> None:
    events = run(runner, SamplingParams(max_tokens=1, temperature=0.0), {"a": [11], "b": [3, 4]})
    assert all(isinstance(e, TokenEvent) for e in events)
