"""The draft model's later positions on the device (gpu_worker/runner/spec_decode/draft_loop.py):
requests asking different numbers of drafts, one of them capped by the draft's context, drafted
together get what each gets alone, and the KV they leave serves their next proposal. Three ways:
over exactly the batch's rows (the torch backend, the CPU's), over the padded static buffers a CUDA
graph holds (the triton backend under Triton's interpreter), and with those buffers "captured" by
a capture that replays the loop, which then runs more positions than the rows ask."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from benchmarks.gpu.gpu_parity import reference_greedy
from common.spec_decode.speculative_config import SpeculativeConfig
from gpu_worker.runner.spec_decode.draft_loop import DraftDecodeLoop
from gpu_worker.runner.spec_decode.draft_model import DraftModelProposer
from gpu_worker.settings import WorkerSettings
from tests.unit.gpu_worker.spec_decode.test_spec_decode import (
    PROMPTS,
    draft_model_config,
    greedy,
    run_pipeline,
)

BLOCK_SIZE = 4
MAX_LEN = 512  # the tiny model's
NUM_DRAFTS = 5  # the setting's: graphs run 4 positions after the catch-up


@dataclass(slots=True)
class Replay:
    step: Callable[[], None]

    def replay(self) -> None:
        self.step()


class ReplayingCapture:
    """`GraphCapture` on the CPU: a "graph" runs its step again (real values, so drafts can be
    compared); what a GPU's capture refuses is the capture-rules lane's (test_draft_loop_capture.py)."""

    def warm_up(self, step: Callable[[], None]) -> None:
        step()

    def capture(self, step: Callable[[], None]) -> Replay:
        return Replay(step)

    def memory_used(self) -> int:
        return 0


def make_proposer(model_dir: Path, how: str) -> DraftModelProposer:
    settings = WorkerSettings(
        model=str(model_dir),
        worker_id="w",
        block_size=BLOCK_SIZE,
        compile=False,
        attention_backend="torch" if how == "exact" else "triton",
        cuda_graphs=how != "exact",
        max_num_seqs=6,  # padded sizes 1, 2, 4, 6
        speculative_config=SpeculativeConfig(
            method="draft_model", model=str(model_dir), num_speculative_tokens=NUM_DRAFTS
        ),
    )
    proposer = DraftModelProposer(settings, str(model_dir), 10**6)
    proposer.use_kv_cache(num_blocks=200)
    assert proposer.loop.padded == (how != "exact")
    if how == "replayed":
        loop = proposer.loop
        proposer.loop = DraftDecodeLoop(
            proposer.model,
            proposer.attn_backend,
            max_num_seqs=6,
            max_model_len=loop.max_model_len,
            num_graph_positions=NUM_DRAFTS - 1,
            spare_slot=proposer.num_blocks * BLOCK_SIZE,
            device=torch.device("cpu"),
            padded=True,
            capture=ReplayingCapture(),
        )
        proposer.loop.capture()
        assert proposer.loop.captured_sizes == [1, 2, 4, 6] and proposer.loop.failed == {}
    return proposer


@pytest.mark.parametrize("how", ["exact", "graph-buffers", "replayed"])
def test_mixed_draft_counts_get_what_each_gets_alone(tiny_model_dir: Path, how: str) -> None:
    torch.set_num_threads(1)
    proposer = make_proposer(tiny_model_dir, how)
    long_context = [(7 * i) % 300 + 3 for i in range(MAX_LEN - 3)]
    contexts = {
        "one": [5, 17, 301, 52, 99],  # k = 1: no later position of its own, its KV left as it was
        "two": [7, 8, 9, 10, 11, 12, 13],
        "four": [40, 12, 411, 8],
        "five": [260, 8, 411, 12, 40, 5, 17, 301, 52],
        "capped": long_context,  # asks 5, its context ends after 3
    }
    ks = {"one": 1, "two": 2, "four": 4, "five": 5, "capped": 5}
    alone = {
        i: reference_greedy(tiny_model_dir, [c], min(ks[i], MAX_LEN - len(c)))[0] for i, c in contexts.items()
    }
    assert len(alone["capped"]) == 3
    first = proposer.propose({i: (c, ks[i]) for i, c in contexts.items()})  # 5 rows: padded to 6
    assert first == alone
    # Each accepted all its drafts and sampled one more token (the capped one has one slot left):
    # the next proposal feeds only those, over the KV the loop wrote, the rows past their own k
    # having written none that is read.
    contexts = {i: [*c, *first[i], 3] for i, c in contexts.items() if i != "capped"}
    contexts["capped"] = [*long_context, *first["capped"][:1], 3]
    alone = {
        i: reference_greedy(tiny_model_dir, [c], min(3, MAX_LEN - len(c)))[0] for i, c in contexts.items()
    }
    replays = proposer.loop.num_replays
    # Two positions after the catch-up: a captured size replays its four.
    assert proposer.propose({i: (c, 3) for i, c in contexts.items()}) == alone
    assert proposer.loop.num_replays - replays == (how == "replayed")
    for req_id in contexts:
        proposer.free(req_id)
    assert sorted(proposer.free_blocks) == list(range(proposer.num_blocks))


def test_the_engine_drafts_through_the_graph_buffers(tiny_model_dir: Path) -> None:
    """The whole pipeline with the triton backend and CUDA graphs asked for (the decode steps' and
    the draft loop's padded buffers, run eagerly on the CPU): the target drafting for itself."""
    expected = reference_greedy(tiny_model_dir, PROMPTS[:2], 12)
    outputs, stats = run_pipeline(
        tiny_model_dir,
        draft_model_config(tiny_model_dir),
        [greedy(12), greedy(12)],
        PROMPTS[:2],
        attention_backend="triton",
        cuda_graphs=True,
    )
    assert outputs == expected
    assert stats.spec_decode_num_accepted_tokens > 0
