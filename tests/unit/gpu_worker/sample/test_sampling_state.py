"""SamplingState: slots that outlive steps, and penalty counts kept up to date without recounting."""

from __future__ import annotations

import torch

from common.protocol import SamplingParams
from gpu_worker.runner.sample.sampler import Sampler
from gpu_worker.runner.sample.sampling_state import SamplingState
from harness.gpu_worker.sampling_rows import token_counts

VOCAB = 48
CPU = torch.device("cpu")
PENALISED = SamplingParams(temperature=1.0, repetition_penalty=1.1, frequency_penalty=0.2, seed=3)


def assert_counts(state: SamplingState, req_id: str, prompt: list[int], outputs: list[int]) -> None:
    penalty_state = state.penalty_state(req_id)
    assert penalty_state is not None
    prompt_mask, output_counts = penalty_state
    expected = token_counts([prompt, outputs], VOCAB, CPU)
    assert torch.equal(prompt_mask, expected[0] > 0)
    assert torch.equal(output_counts, expected[1])


def test_incremental_counts_equal_a_recount_after_many_steps_and_a_re_add() -> None:
    generator = torch.Generator().manual_seed(0)
    state, sampler = SamplingState(VOCAB, CPU), Sampler(seed=0)
    prompts = {"a": [1, 2, 2, 9], "b": [4, 5], "c": [7]}
    outputs: dict[str, list[int]] = {r: [] for r in prompts}
    state.add("a", PENALISED, prompts["a"], [])
    state.add("b", SamplingParams(temperature=0.0), prompts["b"], [])  # no penalties: no counts
    state.add("c", SamplingParams(temperature=0.7, presence_penalty=0.5), prompts["c"], [])
    assert state.penalty_state("b") is None
    for step in range(40):
        # Rows in a different order each step, and "c" sits out every third one (a prefill chunk).
        req_ids = ["c", "a", "b"] if step % 2 else ["b", "a", "c"]
        if step % 3 == 0:
            req_ids.remove("c")
        logits = torch.randn(len(req_ids), VOCAB, generator=generator)
        tokens = sampler.launch(logits, state, req_ids).output().token_ids
        for req_id, token in zip(req_ids, tokens, strict=True):
            outputs[req_id].append(token)
    for req_id in ("a", "c"):
        assert len(set(outputs[req_id])) > 5  # enough distinct tokens for the counts to mean something
        assert_counts(state, req_id, prompts[req_id], outputs[req_id])
    # Preempted and resumed: re-added with the outputs it already has, into a reused slot.
    state.remove("a")
    state.add("d", PENALISED, [3], [3, 3])
    state.add("a", PENALISED, prompts["a"], outputs["a"])
    assert_counts(state, "a", prompts["a"], outputs["a"])
    assert_counts(state, "d", [3], [3, 3])
    for _ in range(5):
        logits = torch.randn(1, VOCAB, generator=generator)
        outputs["a"] += sampler.launch(logits, state, ["a"]).output().token_ids
    assert_counts(state, "a", prompts["a"], outputs["a"])


def test_a_resumed_request_continues_the_same_seeded_tokens() -> None:
    """Its output index comes from the outputs it is re-added with, as if never preempted."""
    logits = torch.randn(12, VOCAB, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=1.0, top_k=20, seed=42)
    state, sampler = SamplingState(VOCAB, CPU), Sampler(seed=0)
    state.add("r", params, [5], [])
    straight = [sampler.launch(logits[i : i + 1], state, ["r"]).output().token_ids[0] for i in range(12)]
    state.remove("r")
    state.add("r", params, [5], straight[:7])
    resumed = [sampler.launch(logits[i : i + 1], state, ["r"]).output().token_ids[0] for i in range(7, 12)]
    assert resumed == straight[7:]
    assert len(set(straight)) > 3


def test_slots_grow_and_are_reused_without_mixing_parameters() -> None:
    state, sampler = SamplingState(VOCAB, CPU, capacity=2), Sampler(seed=0)
    logits = torch.randn(40, VOCAB, generator=torch.Generator().manual_seed(2))
    greedy, biased = SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, logit_bias={17: 100.0})
    for i in range(40):
        state.add(f"r{i}", biased if i % 2 else greedy, [1], [])
    for i in range(0, 40, 4):
        state.remove(f"r{i}")
        state.add(f"n{i}", biased, [1], [])  # a freed slot, now biased
        state.remove(f"r{i + 1}")
        state.add(f"n{i + 1}", greedy, [1], [])  # a freed biased slot, now without bias
    req_ids = [f"n{i}" if i % 4 < 2 else f"r{i}" for i in range(40)]
    assert len(state) == 40
    tokens = sampler.launch(logits, state, req_ids).output().token_ids
    argmax = logits.argmax(-1).tolist()
    for i, token in enumerate(tokens):
        assert token == (17 if i % 4 in (0, 3) else argmax[i]), i


def test_min_tokens_mask_lifts_as_outputs_accumulate_across_steps() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 2], logits[0, 9], logits[0, 4] = 5.0, 4.0, 3.0  # 2 is EOS, 9 a stop id
    state, sampler = SamplingState(VOCAB, CPU, eos_token_ids={2}), Sampler(seed=0)
    state.add("r", SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[9]), [1], [7])
    state.add("other", SamplingParams(temperature=0.0, ignore_eos=True, min_tokens=5), [1], [])
    both = logits.expand(2, -1)
    tokens = [sampler.launch(both, state, ["r", "other"]).output().token_ids for _ in range(3)]
    # "r" resumed with one output: masked for two more steps; "other" has nothing to mask.
    assert tokens == [[4, 2], [4, 2], [2, 2]]
