"""Sampler extras on hand-made logits: bias, min_tokens, penalties, min-p and logprobs, each by its effect."""

from __future__ import annotations

import math

import torch

from common.protocol import SamplingParams
from gpu_worker.runner.sample.logits_processors import apply_penalties
from gpu_worker.runner.sample.sampler import Sampler
from harness.gpu_worker.sampling_rows import sample_rows, token_counts

VOCAB = 32
GREEDY = SamplingParams(temperature=0.0)


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def reference_penalties(
    logits: torch.Tensor, prompt: list[int], output: list[int], rep: float, freq: float, pres: float
) -> torch.Tensor:
    """The vLLM / HF rules written out one token at a time."""
    out = logits.clone()
    for token in range(logits.shape[0]):
        value = float(out[token])
        if token in prompt or token in output:
            value = value / rep if value > 0 else value * rep
        count = output.count(token)
        value -= freq * count + (pres if count else 0.0)
        out[token] = value
    return out


def test_penalties_match_the_rules_token_by_token() -> None:
    logits = random_logits(3, seed=1)
    prompts = [[1, 2, 3], [4, 4], []]
    outputs = [[3, 5, 5, 5], [], [7, 8, 7]]
    params = [
        SamplingParams(repetition_penalty=1.5, frequency_penalty=0.3, presence_penalty=0.7),
        SamplingParams(repetition_penalty=0.8),
        GREEDY,  # no penalties: untouched
    ]
    edited = logits.clone()
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    penalties = torch.tensor(
        [[p.repetition_penalty, p.frequency_penalty, p.presence_penalty] for p in params]
    )[rows]
    prompt_mask = token_counts([prompts[i] for i in rows], VOCAB, logits.device) > 0
    output_counts = token_counts([outputs[i] for i in rows], VOCAB, logits.device)
    apply_penalties(edited, torch.tensor(rows), prompt_mask, output_counts, penalties)
    for row, p in enumerate(params):
        expected = reference_penalties(
            logits[row],
            prompts[row],
            outputs[row],
            p.repetition_penalty,
            p.frequency_penalty,
            p.presence_penalty,
        )
        torch.testing.assert_close(edited[row], expected)
    assert torch.equal(edited[2], logits[2])


def test_penalties_push_greedy_off_repeated_tokens() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 5], logits[0, 6] = 2.0, 1.5
    sampler = Sampler(seed=0)
    assert sample_rows(sampler, logits, [GREEDY], [3], [[]], [[5, 5, 5]]).token_ids == [5]
    for params in (
        SamplingParams(temperature=0.0, frequency_penalty=0.5),  # 2.0 - 3 x 0.5 < 1.5
        SamplingParams(temperature=0.0, presence_penalty=1.0),
        SamplingParams(temperature=0.0, repetition_penalty=1.5),  # 2.0 / 1.5 < 1.5
    ):
        assert sample_rows(sampler, logits, [params], [3], [[]], [[5, 5, 5]]).token_ids == [6], params
    # Repetition also counts the prompt; a negative penalty (frequency) pulls repeats instead.
    prompt_rep = SamplingParams(temperature=0.0, repetition_penalty=1.5)
    assert sample_rows(sampler, logits, [prompt_rep], [0], [[5]], [[]]).token_ids == [6]
    pull = SamplingParams(temperature=0.0, frequency_penalty=-1.0)
    assert sample_rows(sampler, logits, [pull], [1], [[]], [[6]]).token_ids == [6]


def test_logit_bias_forces_and_bans_tokens() -> None:
    logits = random_logits(2, seed=2)
    top = logits.argmax(-1).tolist()
    forced = SamplingParams(temperature=1.0, seed=1, logit_bias={11: 100.0})
    banned = SamplingParams(temperature=0.0, logit_bias={top[1]: -100.0})
    out = sample_rows(Sampler(seed=0), logits, [forced, banned], [0, 0]).token_ids
    assert out[0] == 11
    assert out[1] != top[1]


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 2], logits[0, 9], logits[0, 4] = 5.0, 4.0, 3.0  # 2 is EOS, 9 a stop id
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[9])
    sampler = Sampler(seed=0)
    assert sample_rows(sampler, logits, [params], [0], eos_token_ids={2}).token_ids == [4]
    assert sample_rows(sampler, logits, [params], [1], eos_token_ids={2}).token_ids == [4]
    assert sample_rows(sampler, logits, [params], [2], eos_token_ids={2}).token_ids == [2]


def test_min_p_keeps_only_tokens_near_the_top() -> None:
    logits = torch.full((1, VOCAB), -10.0)
    logits[0, 3], logits[0, 4], logits[0, 5] = 1.0, 1.0 + math.log(0.6), 1.0 + math.log(0.05)
    params = [SamplingParams(temperature=1.0, min_p=0.1, seed=s) for s in range(64)]
    picks = sample_rows(Sampler(seed=0), logits.expand(64, -1), params, [0] * 64).token_ids
    assert set(picks) == {3, 4}


def test_logprobs_are_raw_log_softmax_with_top_k() -> None:
    logits = random_logits(3, seed=3)
    params = [
        SamplingParams(temperature=0.0, logprobs=3, logit_bias={0: 100.0}),
        SamplingParams(temperature=0.7, seed=4, logprobs=0),
        GREEDY,
    ]
    out = sample_rows(Sampler(seed=0), logits, params, [0, 0, 0])
    reference = logits.log_softmax(-1)
    first, second, third = out.logprobs
    assert out.token_ids[0] == 0  # biased, yet its logprob is the model's own
    assert first is not None and math.isclose(first.logprob, float(reference[0, 0]), abs_tol=1e-6)
    top = reference[0].topk(3)
    assert first.top_token_ids == top.indices.tolist()
    assert torch.allclose(torch.tensor(first.top_logprobs), top.values)
    assert second is not None and second.top_token_ids == [] and second.top_logprobs == []
    assert math.isclose(second.logprob, float(reference[1, out.token_ids[1]]), abs_tol=1e-6)
    assert third is None
