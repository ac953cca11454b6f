"""Families whose attention differs from Llama's, end to end: greedy tokens through HTTP -> Redis ->
batcher -> worker equal `generate`'s for a Gemma 3 and a gpt-oss model (windows of 7 tokens,
alternating local and global layers, sinks), with prompts sharing prefixes far longer than the window
(prefix-cache hits), a second turn of a conversation, and a pool and token budget small enough to
prefill in chunks, evict cached prefixes and preempt."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from transformers import AutoConfig

from benchmarks.gpu.gpu_parity import reference_greedy
from harness.models.family_models import save_family
from harness.processes.services import running_stack
from tests.stack.e2e.test_e2e_correctness import Reference, assert_matches_generate
from tests.stack.e2e.test_e2e_prefix_cache import make_cases

# The tiny model's tokenizer serves the family models too (the same vocabulary size).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def family_dir(root: Path, family: str, tiny_model_dir: Path) -> Path:
    path = save_family(root / family, family)
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_model_dir / name, path / name)
    return path


def reference_of(model_dir: Path) -> Reference:
    """test_e2e_prefix_cache's prompts (prefixes of 40, 64 and 19 tokens, one prompt twice) and a
    second turn resending the first conversation, each alone through `generate`."""
    cases, _ = make_cases(AutoConfig.from_pretrained(model_dir).vocab_size)
    first = reference_greedy(model_dir, [p for p, _ in cases], [m for _, m in cases])
    turn2 = (cases[0][0] + first[0] + cases[2][0][-5:], 12)
    [answer] = reference_greedy(model_dir, [turn2[0]], [turn2[1]])
    return [*cases, turn2], [*first, answer]


@pytest.mark.parametrize("family", ["gemma3", "gpt_oss"])
def test_family_greedy_with_prefix_hits_matches_generate(
    family: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    model_dir = family_dir(tmp_path / "models", family, tiny_model_dir)
    reference = reference_of(model_dir)
    with running_stack(
        tmp_path,
        model_dir,
        # Chunks of 32 tokens over 12 blocks of 16: cached prefixes evicted, requests preempted.
        batcher_env={"BATCHER_MAX_NUM_BATCHED_TOKENS": "32", "BATCHER_MAX_NUM_SEQS": "8"},
        worker_env={"WORKER_BLOCK_SIZE": "16", "WORKER_NUM_BLOCKS": "12"},
    ) as stack:
        stats = assert_matches_generate(stack, reference, num_later=1)
    assert stats["prefix_cache_hits"] > 0, stats
    assert stats["num_partial_prefills"] > 0, stats
