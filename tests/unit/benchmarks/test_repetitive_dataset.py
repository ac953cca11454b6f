"""The repetitive workload: seeded, about the asked length, and repeating itself where n-gram drafts
pay, unlike random tokens (a model that copies, simulated at the character level)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from batcher.core.spec_decode.ngram_proposer import propose_ngram
from benchmarks.workloads.datasets import DatasetConfig, sample_requests
from benchmarks.workloads.repetitive import repetitive_prompt
from benchmarks.workloads.tokenizer import BenchTokenizer


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def copied_answer(kind: int, prompt: str) -> str:
    """What a model that follows the prompt copies: the function, the report, the last tool result."""
    if kind == 0:
        return prompt.split("```python\n")[1].split("\n```")[0]
    if kind == 1:
        return prompt.split("Report: ")[1].split("\n\nSummary")[0]
    return prompt.rsplit("tool: ", 1)[1].split("\n")[0]


def mean_accepted_len(prompt: list[int], answer: list[int], k: int = 4) -> float:
    """Tokens per step when n-gram drafts (vLLM's ngram, 1..4) are verified against `answer`."""
    out: list[int] = []
    steps = 0
    while len(out) < len(answer):
        drafts = propose_ngram(prompt + out, 1, 4, min(k, len(answer) - len(out) - 1))
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == answer[len(out) + accepted]:
            accepted += 1
        out = answer[: len(out) + accepted + 1]
        steps += 1
    return len(answer) / steps


def test_each_kind_repeats_itself_where_random_text_does_not() -> None:
    rng = np.random.default_rng(0)
    for kind in range(3):
        text = "".join(map(chr, repetitive_prompt(kind, 600, chars, rng)))
        assert 300 < len(text) <= 600  # whole pieces up to the length
        answer = chars(copied_answer(kind, text))
        assert mean_accepted_len(chars(text), answer) > 1.5, kind
    noise = [int(t) for t in rng.integers(0, 5000, size=600)]
    assert mean_accepted_len(noise[:400], noise[400:]) < 1.1


def test_the_list_is_seeded_and_the_kinds_take_turns(tiny_model_dir: Path) -> None:
    tokenizer = BenchTokenizer(tiny_model_dir)
    config = DatasetConfig(name="repetitive", num_prompts=6, seed=3, input_len=512, output_len=32)
    first, again = sample_requests(config, tokenizer), sample_requests(config, tokenizer)
    assert first == again
    other = sample_requests(dataclasses.replace(config, seed=4), tokenizer)
    assert [r.prompt_token_ids for r in other] != [r.prompt_token_ids for r in first]
    assert all(200 < r.prompt_len <= 512 and r.output_len == 32 for r in first)
    texts = [tokenizer.decode(r.prompt_token_ids) for r in first]
    assert ["```python" in t for t in texts] == [True, False, False] * 2
    assert ["Report:" in t for t in texts] == [False, True, False] * 2
