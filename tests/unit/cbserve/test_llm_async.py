"""`LLM(async_scheduling=True)`: the next step is scheduled and launched before the current one is
read, its decodes taking their input token from the device (gpu_worker/runner/step/launched.py).
Nothing a request gets may change. tests/unit/cbserve/test_llm.py runs every `LLM` test both ways
(greedy equal to `generate`, EOS, stop ids and stop strings ending a request where they would);
here: seeded sampling, penalties and logprobs equal the one-step-at-a-time engine's, the host reads
a step's tokens only when it finishes it, and a step that fails while another runs isolates its
culprit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from batcher.core.scheduler import SchedulerConfig
from benchmarks.gpu.gpu_parity import reference_greedy
from cbserve import LLM, SamplingParams
from cbserve.offline.engine import LLMEngine
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.runner.step.launched import PLACEHOLDER
from gpu_worker.settings import WorkerSettings
from tests.unit.cbserve.cpu_llm import cpu_llm
from tests.unit.cbserve.test_llm import SIZES, greedy, only, prompts


@pytest.fixture(scope="module")
def async_llm(tiny_model_dir: Path) -> Iterator[LLM]:
    yield cpu_llm(tiny_model_dir, async_scheduling=True, **SIZES)


def test_seeded_sampling_penalties_and_logprobs_equal_one_step_at_a_time(
    async_llm: LLM, tiny_model_dir: Path
) -> None:
    penalties = {"repetition_penalty": 1.3, "frequency_penalty": 0.4, "presence_penalty": 0.2}
    params = [
        SamplingParams(temperature=0.9, seed=11, max_tokens=14, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.7, top_p=0.8, seed=5, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=1, **penalties),  # type: ignore[arg-type]
        SamplingParams(temperature=0.8, top_k=20, seed=3, max_tokens=10, min_tokens=6),
    ]
    cases = [{"prompt_token_ids": p} for p in prompts(async_llm.get_tokenizer().vocab_size)[:4]]
    overlapped = async_llm.generate(cases, params, use_tqdm=False)
    one_at_a_time = cpu_llm(tiny_model_dir, **SIZES).generate(cases, params, use_tqdm=False)
    for got, want in zip(overlapped, one_at_a_time, strict=True):
        assert only(got) == only(want)
        assert got.outputs[0].finish_reason == want.outputs[0].finish_reason
        got_logprobs, want_logprobs = got.outputs[0].logprobs, want.outputs[0].logprobs
        assert (got_logprobs is None) == (want_logprobs is None)
        for g, w in zip(got_logprobs or [], want_logprobs or [], strict=True):
            assert list(g) == list(w)
            assert [x.logprob for x in g.values()] == pytest.approx([x.logprob for x in w.values()], abs=1e-5)


def test_the_host_reads_a_step_only_when_it_finishes_it(async_llm: LLM) -> None:
    engine = async_llm.llm_engine
    runner = engine.runner
    assert isinstance(runner, ModelRunner)
    engine.add_request("r", [5, 6, 7], greedy(6))
    engine.step()  # the prefill, read; the first decode launched with its input on the device
    state = runner.requests["r"]
    assert state.token_ids[-1] == PLACEHOLDER and state.num_computed_tokens == state.num_tokens - 1
    while engine.has_unfinished_requests():
        engine.step()
    assert PLACEHOLDER not in state.token_ids and state.num_output_tokens == 6


def test_a_step_that_fails_while_another_runs_fails_its_culprit_alone(
    tiny_model_dir: Path,
) -> None:
    prompt, other = [11, 12, 13, 14], [21, 22, 23]
    free, expected = reference_greedy(tiny_model_dir, [prompt, other], [8, 8])
    poison = next(t for i, t in enumerate(free) if i >= 2 and t not in free[:i] + prompt)
    settings = WorkerSettings(
        model=str(tiny_model_dir), device="cpu", num_blocks=64, block_size=8, fail_on_token_id=poison
    )
    engine = LLMEngine.load(settings, SchedulerConfig(async_scheduling=True))
    engine.add_request("poisoned", prompt, greedy(8))
    engine.add_request("other", other, greedy(8))
    tokens: dict[str, list[int]] = {"poisoned": [], "other": []}
    errors: dict[str, str | None] = {}
    while engine.has_unfinished_requests():
        step = engine.step()
        for event in step.events:
            tokens[event.req_id].append(event.token_id)  # type: ignore[union-attr]
        errors.update({r.req_id: r.error for r in step.finished if r.finish_reason == "error"})
    assert tokens["other"] == expected
    # It sampled the poison token; the step that ran with it as input failed, and it alone.
    assert tokens["poisoned"] == free[: free.index(poison) + 1]
    assert list(errors) == ["poisoned"] and "fail_on_token_id" in str(errors["poisoned"])
