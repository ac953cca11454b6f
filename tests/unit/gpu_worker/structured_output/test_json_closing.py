"""A JSON row whose model would stop before the JSON is complete: the probability of its forbidden stop
tokens goes to the tokens that close what is open (gpu_worker/runner/structured_output/json_closing.py),
against the tiny model's real tokenizer and xgrammar's masks."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer

from common.protocol import StructuredOutput
from gpu_worker.runner.structured_output.matchers import StructuredOutputs

EOS, IM_END = 0, 2  # the tiny model's stop tokens (generation_config)
PET = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
    "required": ["name", "kind"],
}
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"],
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


@pytest.fixture()
def outputs(tiny_model_dir: Path, tokenizer: Tokenizer) -> StructuredOutputs:
    vocab_size = tokenizer.get_vocab_size()
    return StructuredOutputs(str(tiny_model_dir), vocab_size, [EOS, IM_END], torch.device("cpu"))


def masked(
    outputs: StructuredOutputs,
    tokenizer: Tokenizer,
    schema: dict[str, Any],
    written: str,
    stop_logit: float,
    ignore_eos: bool = False,
) -> torch.Tensor:
    """The masked logits of a JSON request that wrote `written`, its model's logits all 0 but the stop
    tokens' `stop_logit`."""
    output = StructuredOutput(kind="json", definition=json.dumps(schema))
    assert outputs.add("j", output, tokenizer.encode(written).ids, ignore_eos) is None
    logits = torch.zeros(1, outputs.vocab_size)
    logits[0, [EOS, IM_END]] = stop_logit
    mask, _ = outputs.masks(["j"], [])
    assert mask is not None
    mask.apply(logits)
    return logits[0]


def raised(row: torch.Tensor, tokenizer: Tokenizer) -> set[str]:
    """The texts of the tokens the steering raised above the model's logit of 0."""
    ids = torch.nonzero(row > 1e-6).flatten().tolist()
    return {tokenizer.decode([t], skip_special_tokens=False) for t in ids}


def test_a_model_that_would_stop_inside_a_string_closes_it(
    outputs: StructuredOutputs, tokenizer: Tokenizer
) -> None:
    row = masked(outputs, tokenizer, PET, '{"name": "Rex', stop_logit=10.0)
    closers = raised(row, tokenizer)
    assert closers and all(text.startswith('"') for text in closers), closers
    assert tokenizer.decode([int(row.argmax())]) in closers
    # The stop tokens' probability, moved onto the closers in proportion: each gains the same factor.
    allowed = row.isfinite()
    num_allowed, num_closers = int(allowed.sum()), len(closers)
    p_stop = 2 * math.exp(10.0) / (2 * math.exp(10.0) + outputs.vocab_size - 2)
    p_closer = 1 / (2 * math.exp(10.0) + outputs.vocab_size - 2)
    assert float(row.max()) == pytest.approx(math.log1p(p_stop / (num_closers * p_closer)), rel=1e-4)
    assert int((row[allowed] == 0).sum()) == num_allowed - num_closers  # the rest unchanged


def test_after_a_number_it_closes_the_object_or_writes_the_next_property(
    outputs: StructuredOutputs, tokenizer: Tokenizer
) -> None:
    # y is required, so only a comma goes on from x's number; after y's, the brace ends the object.
    after_x = raised(masked(outputs, tokenizer, POINT, '{"x": 12', 10.0), tokenizer)
    assert {text.strip() for text in after_x} == {","}
    assert raised(masked(outputs, tokenizer, POINT, '{"x": 12, "y": 3', 10.0), tokenizer) == {"}"}


def test_a_model_that_does_not_lean_to_stop_is_barely_changed(
    outputs: StructuredOutputs, tokenizer: Tokenizer
) -> None:
    row = masked(outputs, tokenizer, PET, '{"name": "Rex', stop_logit=-30.0)
    assert float(row[row.isfinite()].abs().max()) < 1e-9


def test_a_request_that_ignores_eos_is_not_steered(outputs: StructuredOutputs, tokenizer: Tokenizer) -> None:
    row = masked(outputs, tokenizer, PET, '{"name": "Rex', stop_logit=10.0, ignore_eos=True)
    assert float(row[row.isfinite()].abs().max()) == 0.0
    assert raised(row, tokenizer) == set()
