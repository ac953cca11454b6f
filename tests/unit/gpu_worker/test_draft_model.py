"""The draft model's proposals: its own greedy continuation, kept right across rejections and
requests that come back, with one KV cache per request fed only the tokens it has not seen."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.gpu_parity import reference_greedy
from gpu_worker.draft_model import DraftModelProposer

PROMPT = [5, 17, 301, 52, 99, 260, 8, 411, 12, 40]


@pytest.fixture(scope="module")
def proposer(tiny_model_dir: Path) -> DraftModelProposer:
    torch.set_num_threads(1)
    return DraftModelProposer(str(tiny_model_dir), 10**6, torch.device("cpu"), torch.float32)


def test_drafts_are_the_draft_models_greedy_continuation(
    tiny_model_dir: Path, proposer: DraftModelProposer
) -> None:
    expected = reference_greedy(tiny_model_dir, [PROMPT], 12)[0]
    assert proposer.propose("a", PROMPT, 4) == expected[:4]
    # The step accepted two drafts and chose another token: the cache drops the third draft's KV.
    other = (expected[2] + 1) % 100
    context = [*PROMPT, *expected[:2], other]
    assert proposer.propose("a", context, 3) == reference_greedy(tiny_model_dir, [context], 3)[0]
    # All accepted plus the bonus token: only the new tokens are fed.
    context = [*PROMPT, *expected[:5]]
    assert proposer.propose("b", PROMPT, 4) == expected[:4]
    assert proposer.propose("b", context, 4) == expected[5:9]


def test_a_freed_request_starts_again_from_its_tokens(
    tiny_model_dir: Path, proposer: DraftModelProposer
) -> None:
    expected = reference_greedy(tiny_model_dir, [PROMPT], 6)[0]
    proposer.propose("c", [1, 2, 3], 2)
    proposer.free("c")
    assert proposer.propose("c", PROMPT, 6) == expected


def test_a_larger_vocabulary_than_the_targets_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="target's tokenizer"):
        DraftModelProposer(str(tiny_model_dir), 8, torch.device("cpu"), torch.float32)
