"""Sampler on hand-made logits: greedy paths, filtering, and seeds that ignore batch composition."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.worker_step import sampler_step
from common.protocol import SamplingParams
from gpu_worker.runner.sample.sampler import Sampler, sample_plain, sample_top_k, sample_top_p
from gpu_worker.runner.sample.seeded_uniform import mix64, mix64_tensor, seeded_uniform, seeded_uniforms
from harness.gpu_worker.sampling_rows import sample_rows

VOCAB = 64
# The device kernels' tests also run on CUDA where there is one (int64 wrap-around, searchsorted).
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_take_argmax() -> None:
    logits = random_logits(5)
    params = [SamplingParams(temperature=0.0)] * 5
    assert sample_rows(Sampler(seed=0), logits, params, [0] * 5).token_ids == logits.argmax(-1).tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_takes_the_first_of_tied_maxima_as_argmax_does(device: str) -> None:
    """What transformers' generate picks (argmax) on ties, -inf rows and NaN, over a real vocabulary."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(-2, 2, (6, 32000), generator=gen).float()
    logits[1] = float("-inf")
    logits[2, ::3] = float("-inf")
    logits[3, 17] = float("nan")
    logits[4, 31999] = 5.0
    logits = logits.to(device)
    params = [SamplingParams(temperature=0.0)] * 6
    picked = sample_rows(Sampler(seed=0, device=torch.device(device)), logits, params, [0] * 6).token_ids
    assert picked == logits.argmax(-1).tolist()
    assert picked[1] == 0 and picked[3] == 17 and picked[4] == 31999


def test_seeded_sample_is_reproducible_and_batch_independent() -> None:
    logits = random_logits(6)
    seeded = SamplingParams(temperature=1.0, seed=1234)
    others = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=5, seed=9),
    ]
    alone = [sample_rows(Sampler(seed=s), logits[:1], [seeded], [7]).token_ids for s in (1, 2)]
    # Same row, other neighbours, other runner generator state, and its own row placed last.
    mixed_logits = torch.cat([logits[3:6], logits[:1]])
    mixed = sample_rows(Sampler(seed=3), mixed_logits, [*others, seeded], [0, 1, 2, 7]).token_ids
    assert alone[0] == alone[1] == [mixed[-1]]


def test_seeded_sample_depends_on_output_index() -> None:
    logits = torch.zeros(1, VOCAB)  # uniform: 32 indices should not all land on the same token
    params = [SamplingParams(temperature=1.0, seed=5)]
    sampler = Sampler(seed=0)
    assert len({sample_rows(sampler, logits, params, [i]).token_ids[0] for i in range(32)}) > 1


def test_top_k_one_and_tiny_top_p_equal_greedy() -> None:
    logits = random_logits(8, seed=1)
    greedy = logits.argmax(-1)
    uniforms = torch.rand(8, generator=torch.Generator().manual_seed(2))
    scaled = logits / 1.5
    ones, off = torch.ones(8, dtype=torch.long), torch.full((8,), VOCAB)
    tiny_p, no_min_p = torch.full((8,), 1e-6), torch.zeros(8)
    assert torch.equal(sample_top_k(scaled, uniforms, ones, 1), greedy)
    assert torch.equal(sample_top_p(scaled, uniforms, tiny_p, off, no_min_p), greedy)
    tiny_p_params = [SamplingParams(temperature=1.5, top_p=1e-6)] * 8
    assert sample_rows(Sampler(seed=0), logits, tiny_p_params, [0] * 8).token_ids == greedy.tolist()


def test_top_k_keeps_only_k_most_likely() -> None:
    logits = random_logits(1, seed=4)
    allowed = set(logits[0].topk(3).indices.tolist())
    params = [SamplingParams(temperature=2.0, top_k=3, seed=s) for s in range(40)]
    picks = sample_rows(Sampler(seed=0), logits.expand(40, -1), params, [0] * 40).token_ids
    assert set(picks) <= allowed
    assert len(set(picks)) > 1


def test_temperature_sampling_differs_from_greedy_across_seeds() -> None:
    logits = random_logits(1, seed=6) / 3  # flatter, so sampling visibly spreads
    greedy = int(logits.argmax())
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(64)]
    picks = sample_rows(Sampler(seed=0), logits.expand(64, -1), params, [0] * 64).token_ids
    assert any(p != greedy for p in picks)
    assert len(set(picks)) > 4


def test_unseeded_requests_follow_the_runner_generator() -> None:
    logits = torch.zeros(16, VOCAB)
    params = [SamplingParams(temperature=1.0)] * 16
    first, again = (
        sample_rows(Sampler(seed=11), logits, params, [0] * 16).token_ids,
        sample_rows(Sampler(seed=11), logits, params, [0] * 16).token_ids,
    )
    assert first == again
    assert len(set(first)) > 1


@pytest.mark.parametrize("device", DEVICES)
def test_device_hash_equals_the_python_splitmix64(device: str) -> None:
    values = [0, 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15, 12345678901234567]
    signed = [v - 2**64 if v >= 2**63 else v for v in values]
    mixed = mix64_tensor(torch.tensor(signed, device=device))
    assert [m % 2**64 for m in mixed.tolist()] == [mix64(v) for v in values]
    seeds, indices = [0, 7, -1, 2**63 - 1, -(2**63)], [0, 1, 5, 1000, 2**40]
    mixed_seeds = torch.tensor([m - 2**64 if m >= 2**63 else m for m in (mix64(s % 2**64) for s in seeds)])
    drawn = seeded_uniforms(mixed_seeds.to(device), torch.tensor(indices, device=device))
    assert drawn.dtype == torch.float32
    assert drawn.tolist() == [seeded_uniform(s, i) for s, i in zip(seeds, indices, strict=True)]
    assert all(0.0 <= u < 1.0 for u in drawn.tolist())


@pytest.mark.parametrize("device", DEVICES)
def test_inverse_cdf_draws_the_token_whose_interval_holds_the_uniform(device: str) -> None:
    # Tokens 1, 3, 5, 7 carry 0.1, 0.2, 0.3, 0.4; the even ones are impossible (-inf).
    logits = torch.full((1, 8), float("-inf"), device=device)
    logits[0, 1::2] = torch.tensor([0.1, 0.2, 0.3, 0.4], device=device).log()
    uniforms = [
        0.0,
        0.0999,
        0.1001,
        0.2999,
        0.3001,
        0.5999,
        0.6001,
        0.6999,
        0.7001,
        0.8999,
        0.9001,
        1 - 2**-24,
    ]
    # Without a sort the CDF runs over token ids: 1 up to 0.1, 3 up to 0.3, 5 up to 0.6, then 7.
    expected = [1, 1, 3, 3, 5, 5, 7, 7, 7, 7, 7, 7]
    rows = logits.expand(len(uniforms), -1)
    u = torch.tensor(uniforms, device=device)
    assert sample_plain(rows, u).tolist() == expected
    # Sorted paths walk the most likely first: 7 up to 0.4, 5 up to 0.7, 3 up to 0.9, then 1.
    sorted_expected = [7, 7, 7, 7, 7, 5, 5, 5, 3, 3, 1, 1]
    n = len(uniforms)
    assert sample_top_k(rows, u, torch.full((n,), 8, device=device), 8).tolist() == sorted_expected
    everything = (
        torch.ones(n, device=device),
        torch.full((n,), 8, device=device),
        torch.zeros(n, device=device),
    )
    assert sample_top_p(rows, u, *everything).tolist() == sorted_expected


def reference_pick(logits: torch.Tensor, params: SamplingParams, uniform: float) -> int:
    """vLLM's filters written out in float64: min-p, top-k, then top-p over what remains; inverse CDF
    over token ids in vocabulary order without top-k / top-p, most likely first with them."""
    probs = (logits.double() / params.temperature).softmax(-1).tolist()
    by_rank = sorted(range(len(probs)), key=lambda t: (-probs[t], t))
    kept = [t for t in by_rank if probs[t] >= params.min_p * probs[by_rank[0]]]
    if params.top_k:
        kept = kept[: params.top_k]
    total = sum(probs[t] for t in kept)
    final, mass = [], 0.0
    for t in kept:
        if final and mass >= params.top_p * total:
            break
        final.append(t)
        mass += probs[t]
    if not params.top_k and params.top_p >= 1.0:
        final.sort()  # no sort on this path: the CDF runs over token ids
    target, acc = uniform * sum(probs[t] for t in final), 0.0
    for t in final:
        acc += probs[t]
        if acc > target:
            return t
    return final[-1]


@pytest.mark.parametrize("device", DEVICES)
def test_filtered_rows_match_a_reference_on_known_uniforms(device: str) -> None:
    filters = [
        {},
        {"min_p": 0.2},
        {"top_k": 5},
        {"top_k": 9, "min_p": 0.1},
        {"top_p": 0.6},
        {"top_p": 0.8, "top_k": 4},
        {"top_p": 0.7, "min_p": 0.05},
        {"top_p": 0.9, "top_k": 12, "min_p": 0.02},
    ]
    params = [
        SamplingParams(temperature=temperature, seed=1000 + i, **f)  # type: ignore[arg-type]
        for i, (f, temperature) in enumerate((f, t) for t in (0.5, 1.0, 1.7) for f in filters)
    ]
    logits = random_logits(len(params), seed=8)
    index = 3  # output index: each row's uniform is seeded_uniform(seed, 3)
    out = sample_rows(
        Sampler(seed=0, device=device), logits.to(device), params, [index] * len(params)
    ).token_ids
    for row, p in enumerate(params):
        assert p.seed is not None
        assert out[row] == reference_pick(logits[row], p, seeded_uniform(p.seed, index)), p


def test_sampler_step_benchmark_prints_one_timing_per_batch_kind(capsys: pytest.CaptureFixture[str]) -> None:
    sampler_step.main(["--rows", "9", "--vocab", "200", "--repeats", "1"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["batch"] for line in lines] == ["mixed", "temperature", "greedy"]
    assert all(line["ms"] > 0 and line["rows"] == 9 for line in lines)
