"""The draft model's proposals over its own paged pool: its greedy continuation, many requests in one
forward per position, kept right across rejections and requests that come back, fed only the tokens
its KV lacks, and no drafts (never an error) for a request the pool has no room for."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.gpu.gpu_parity import reference_greedy
from gpu_worker.runner.spec_decode.draft_model import DraftModelProposer
from gpu_worker.settings import WorkerSettings

PROMPT = [5, 17, 301, 52, 99, 260, 8, 411, 12, 40]
BLOCK_SIZE = 4


def make_proposer(model_dir: Path, num_blocks: int, target_vocab_size: int = 10**6) -> DraftModelProposer:
    settings = WorkerSettings(model=str(model_dir), worker_id="w", block_size=BLOCK_SIZE, compile=False)
    proposer = DraftModelProposer(settings, str(model_dir), target_vocab_size)
    proposer.use_kv_cache(num_blocks)
    return proposer


@pytest.fixture(scope="module")
def proposer(tiny_model_dir: Path) -> DraftModelProposer:
    torch.set_num_threads(1)
    return make_proposer(tiny_model_dir, num_blocks=64)


def test_drafts_are_the_draft_models_greedy_continuation(
    tiny_model_dir: Path, proposer: DraftModelProposer
) -> None:
    expected = reference_greedy(tiny_model_dir, [PROMPT], 12)[0]
    assert proposer.propose({"a": (PROMPT, 4)}) == {"a": expected[:4]}
    # The step accepted two drafts and chose another token: the third draft's KV is cut off.
    other = (expected[2] + 1) % 100
    context = [*PROMPT, *expected[:2], other]
    assert proposer.propose({"a": (context, 3)})["a"] == reference_greedy(tiny_model_dir, [context], 3)[0]
    # All accepted plus the bonus token: only the new tokens are fed.
    assert proposer.propose({"b": (PROMPT, 4)})["b"] == expected[:4]
    assert proposer.propose({"b": ([*PROMPT, *expected[:5]], 4)})["b"] == expected[5:9]
    proposer.free("a")
    proposer.free("b")


def test_requests_drafted_together_get_what_each_gets_alone(
    tiny_model_dir: Path, proposer: DraftModelProposer
) -> None:
    # One in the middle of its catch-up chunk, one fed a single token, one new, asking for
    # different numbers of drafts: one forward per position serves them all.
    contexts = {"x": PROMPT, "y": PROMPT[:3], "z": [7, 8, 9, 10, 11, 12, 13, 14, 15]}
    ks = {"x": 5, "y": 2, "z": 3}
    alone = {i: reference_greedy(tiny_model_dir, [c], ks[i])[0] for i, c in contexts.items()}
    first = proposer.propose({i: (c, ks[i]) for i, c in contexts.items()})
    assert first == alone
    # Next step: x accepted one draft, y all of them, z none; each continues from its own tokens.
    contexts = {
        "x": [*PROMPT, first["x"][0], 3],
        "y": [*PROMPT[:3], *first["y"], 6],
        "z": [*contexts["z"], (first["z"][0] + 1) % 100],
    }
    alone = {i: reference_greedy(tiny_model_dir, [c], 4)[0] for i, c in contexts.items()}
    assert proposer.propose({i: (c, 4) for i, c in contexts.items()}) == alone
    for req_id in contexts:
        proposer.free(req_id)
    assert sorted(proposer.free_blocks) == list(range(proposer.num_blocks))


def test_a_freed_request_starts_again_from_its_tokens(
    tiny_model_dir: Path, proposer: DraftModelProposer
) -> None:
    expected = reference_greedy(tiny_model_dir, [PROMPT], 6)[0]
    proposer.propose({"c": ([1, 2, 3], 2)})
    proposer.free("c")
    assert proposer.propose({"c": (PROMPT, 6)}) == {"c": expected}
    # Tokens that differ from what its draft KV holds, well before their end: fed from there.
    changed = [*PROMPT[:4], PROMPT[4] + 1, *PROMPT[5:], *expected]
    assert proposer.propose({"c": (changed, 3)})["c"] == reference_greedy(tiny_model_dir, [changed], 3)[0]
    proposer.free("c")


def test_a_request_the_pool_cannot_hold_gets_no_drafts(tiny_model_dir: Path) -> None:
    # Three blocks of 4: PROMPT with 3 drafts takes all of them (the last draft's KV is never written).
    small = make_proposer(tiny_model_dir, num_blocks=3)
    expected = reference_greedy(tiny_model_dir, [PROMPT], 3)[0]
    assert small.propose({"a": (PROMPT, 3), "b": ([4, 5], 2)}) == {"a": expected}
    assert small.free_blocks == []
    small.free("a")
    assert small.propose({"b": ([4, 5], 2)}) == {"b": reference_greedy(tiny_model_dir, [[4, 5]], 2)[0]}


def test_a_larger_vocabulary_than_the_targets_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="target's tokenizer"):
        make_proposer(tiny_model_dir, num_blocks=4, target_vocab_size=8)
