"""Structured outputs on the worker: xgrammar's masks against the tiny model's real tokenizer, and
ModelRunner steps whose sampled text always follows the request's grammar, also across preemption."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer

from common.protocol import SamplingParams, StructuredOutput
from gpu_worker.runner.model_runner import ModelRunner
from gpu_worker.runner.structured_output.matchers import GrammarMask, StructuredOutputs
from gpu_worker.settings import WorkerSettings
from tests.unit.gpu_worker.test_model_runner import (
    BLOCK_SIZE,
    NUM_BLOCKS,
    SimRequest,
    make_requests,
    run_to_completion,
)

EOS, IM_END = 0, 2  # the tiny model's stop tokens (generation_config)
CHOICE = StructuredOutput(kind="choice", definition=json.dumps(["yes", "no"]))
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "kind": {"enum": ["cat", "dog", "owl"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "size": {"type": "object", "properties": {"h": {"type": "boolean"}}, "required": ["h"]},
        "note": {"type": "string", "maxLength": 4},
    },
    "required": ["name", "kind", "tags", "size"],
}
JSON = StructuredOutput(kind="json", definition=json.dumps(SCHEMA))


@pytest.fixture(scope="module", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


@pytest.fixture()
def outputs(tiny_model_dir: Path, tokenizer: Tokenizer) -> StructuredOutputs:
    # Padded past the tokenizer, as models often are: the extra ids must never be allowed.
    return StructuredOutputs(
        str(tiny_model_dir), tokenizer.get_vocab_size() + 8, [EOS, IM_END], torch.device("cpu")
    )


def allowed(outputs: StructuredOutputs, req_ids: list[str], row: int) -> set[int]:
    """The tokens the step's mask leaves possible on `row` (logits of zeros, masked; a JSON row's
    closing tokens may be raised, json_closing.py)."""
    logits = torch.zeros(len(req_ids), outputs.vocab_size)
    mask, _ = outputs.masks(req_ids, [])
    assert mask is not None
    mask.apply(logits)
    return set(torch.nonzero(logits[row].isfinite()).flatten().tolist())


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def test_the_mask_allows_exactly_the_tokens_that_keep_the_grammar(
    outputs: StructuredOutputs, tokenizer: Tokenizer
) -> None:
    assert outputs.add("c", CHOICE, []) is None
    # Row 0 is unconstrained: its mask is never applied.
    first = allowed(outputs, ["free", "c"], 1)
    expected = {
        t
        for t in range(tokenizer.get_vocab_size())
        if (text := token_text(tokenizer, t)) and ("yes".startswith(text) or "no".startswith(text))
    }
    assert first == expected and first
    logits = torch.zeros(2, outputs.vocab_size)
    mask, _ = outputs.masks(["free", "c"], [])
    assert mask is not None
    mask.apply(logits)
    assert not logits[0].isinf().any()
    assert logits[1, tokenizer.get_vocab_size() :].isinf().all()  # the padded ids


def test_a_rebuilt_matcher_resumes_where_its_output_left_off(
    outputs: StructuredOutputs, tokenizer: Tokenizer
) -> None:
    ye = tokenizer.encode("ye").ids
    assert outputs.add("c", CHOICE, ye) is None  # as a request comes back after preemption
    (s,) = tokenizer.encode("s").ids
    assert allowed(outputs, ["c"], 0) == {
        t for t in range(tokenizer.get_vocab_size()) if token_text(tokenizer, t) == "s"
    }
    assert outputs.accept(["c"], [[s]]) == {}  # complete, but only a stop token ends it
    assert allowed(outputs, ["c"], 0) == {EOS, IM_END}
    assert outputs.accept(["c"], [[EOS]]) == {"c": "stop"}


def _allowed_rows(mask: GrammarMask | None, num_rows: int, vocab_size: int) -> list[set[int]]:
    assert mask is not None
    logits = torch.zeros(num_rows, vocab_size)
    mask.apply(logits)
    return [set(torch.nonzero(row.isfinite()).flatten().tolist()) for row in logits]


def test_drafts_are_masked_by_the_grammar_after_the_drafts_before_them(
    outputs: StructuredOutputs, tokenizer: Tokenizer
) -> None:
    (y,), (e,), (s,), (n,) = (tokenizer.encode(c).ids for c in "yesn")
    assert outputs.add("c", CHOICE, []) is None
    alone, _ = outputs.masks(["c"], [])
    # Drafts y, e, s: each row masked as if the ones before it were output; the bonus row after all.
    bonus, drafts = outputs.masks(["c"], [("c", [y, e, s])])
    rows = _allowed_rows(drafts, 3, outputs.vocab_size)
    assert {y, n} <= rows[0] and e in rows[1] - rows[0] and s in rows[2] - rows[1]
    assert _allowed_rows(bonus, 1, outputs.vocab_size)[0] == {EOS, IM_END}
    # A draft the grammar refuses (n after y): the rows after it are never reached and copy its mask.
    _, drafts = outputs.masks(["c"], [("c", [y, n, e])])
    rows = _allowed_rows(drafts, 3, outputs.vocab_size)
    assert n not in rows[1] and e in rows[1] and rows[2] == rows[1]
    # A stop token among the drafts ends the grammar: nothing after it is filled from a done matcher.
    bonus, drafts = outputs.masks(["c"], [("c", [n, tokenizer.encode("o").ids[0], EOS, y])])
    assert _allowed_rows(drafts, 4, outputs.vocab_size)[3] == {EOS, IM_END}
    # The matcher is where it was: the step's own tokens are accepted after sampling.
    assert torch.equal(outputs.masks(["c"], [])[0].bitmask, alone.bitmask)  # type: ignore[union-attr]
    run = [y, e, s, EOS, y]
    assert outputs.accept(["c"], [run]) == {"c": "stop"}
    assert run == [y, e, s, EOS]  # cut after the stop token that ended the grammar


def test_json_never_holds_a_raw_control_character(outputs: StructuredOutputs, tokenizer: Tokenizer) -> None:
    # xgrammar 0.2 lets control characters into a string with maxLength; JSON forbids them raw.
    text = StructuredOutput(kind="json", definition='{"type": "string", "maxLength": 5}')
    assert outputs.add("j", text, tokenizer.encode('"').ids) is None
    possible = allowed(outputs, ["j"], 0)
    assert possible and all(
        not any(ord(c) < 0x20 for c in token_text(tokenizer, t)) for t in possible if t not in (EOS, IM_END)
    )
    control = [t for t in range(tokenizer.get_vocab_size()) if token_text(tokenizer, t) == "\x02"]
    assert control and not set(control) & possible


def test_output_that_breaks_the_grammar_or_a_bad_grammar_is_an_error(
    outputs: StructuredOutputs, tokenizer: Tokenizer
) -> None:
    error = outputs.add("c", CHOICE, tokenizer.encode("maybe").ids)
    assert error is not None and "does not follow" in error
    error = outputs.add("g", StructuredOutput(kind="grammar", definition="root ::= undefined_rule"), [])
    assert error is not None and "undefined_rule" in error
    assert len(outputs) == 0 and outputs.masks(["c", "g"], []) == (None, None)


def test_grammars_are_compiled_once_and_evicted_least_recently_used(outputs: StructuredOutputs) -> None:
    for i in range(4):
        assert outputs.add(f"c{i}", CHOICE, []) is None  # n choices of one request share one
    assert outputs.cache.num_compiled == 1
    outputs.cache._capacity = 2
    regexes = [StructuredOutput(kind="regex", definition=f"a{{{i}}}") for i in (1, 2)]
    for i, regex in enumerate(regexes):
        outputs.add(f"r{i}", regex, [])
    outputs.add("c4", CHOICE, [])  # evicted by the second regex
    assert outputs.cache.num_compiled == 4
    outputs.add("r2", regexes[1], [])  # still cached
    assert outputs.cache.num_compiled == 4


@pytest.fixture(scope="module")
def runner(tiny_model_dir: Path) -> ModelRunner:
    settings = WorkerSettings(
        model=str(tiny_model_dir), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, worker_id="so", seed=0
    )
    return ModelRunner(settings)


def texts(tokenizer: Tokenizer, requests: list[SimRequest]) -> list[str]:
    return [tokenizer.decode(r.outputs) for r in requests]


@pytest.mark.parametrize("preempt", [{}, {9: "r1"}], ids=["batched", "preempted"])
def test_sampled_json_always_validates(
    runner: ModelRunner, tokenizer: Tokenizer, preempt: dict[int, str]
) -> None:
    params = [
        SamplingParams(max_tokens=80, temperature=1.0, seed=seed, structured_output=JSON) for seed in range(3)
    ]
    requests = make_requests(params)
    run_to_completion(runner, requests, preempt=preempt)
    for request, text in zip(requests, texts(tokenizer, requests), strict=True):
        assert request.outputs[-1] in (EOS, IM_END), text  # the grammar ended it, not max_tokens
        jsonschema.validate(json.loads(text), SCHEMA)
    if preempt:
        assert requests[1].attempt == 1
        # Seeded tokens depend on (seed, index) alone: the recomputed request continues identically.
        alone = make_requests(params)[1:2]
        alone[0].arrival_step = 0
        run_to_completion(runner, alone, preempt={})
        assert alone[0].outputs == requests[1].outputs


def test_the_grammar_composes_with_the_other_logits_processors(
    runner: ModelRunner, tokenizer: Tokenizer
) -> None:
    regex = StructuredOutput(kind="regex", definition="[0-9]{2,4}")
    (zero,) = tokenizer.encode("0").ids
    (letter,) = tokenizer.encode("e").ids
    params = [
        # logit_bias cannot lift a forbidden token; min_tokens past the grammar's end yields to it.
        SamplingParams(max_tokens=20, temperature=0.0, logit_bias={letter: 100.0}, structured_output=regex),
        SamplingParams(max_tokens=20, temperature=1.0, seed=3, min_tokens=12, structured_output=regex),
        SamplingParams(
            max_tokens=20,
            temperature=0.7,
            top_k=5,
            top_p=0.8,
            repetition_penalty=1.5,
            seed=4,
            frequency_penalty=2.0,
            logit_bias={zero: 5.0},
            logprobs=2,
            structured_output=regex,
        ),
        SamplingParams(max_tokens=6, temperature=1.0, seed=5),  # unconstrained in the same steps
    ]
    requests = make_requests(params)
    run_to_completion(runner, requests, preempt={})
    for request, text in zip(requests[:3], texts(tokenizer, requests[:3]), strict=True):
        assert request.outputs[-1] in (EOS, IM_END)
        assert re.fullmatch("[0-9]{2,4}", text), text
    assert len(requests[3].outputs) == 6
