"""The worker's decoder compiled with inductor (gpu_worker/runner/forward/compile.py, precompiled.py):
the very tokens transformers' `generate` gives, one graph for every step shape, the compiled forward
loaded from disk by a restarted worker (and compiled again when the forward's code changes), and int8
weights compiled as they run eagerly.

Here, not in tests/unit/: each compilation takes tens of seconds and one test starts a process.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from benchmarks.gpu.gpu_parity import reference_greedy
from common.protocol import SamplingParams
from gpu_worker.runner.forward.decoder import Decoder
from gpu_worker.runner.forward.precompiled import PrecompiledForward
from gpu_worker.runner.model_runner import ModelRunner
from tests.unit.gpu_worker.spec_decode.test_spec_decode import MAX_TOKENS as SPEC_MAX_TOKENS
from tests.unit.gpu_worker.spec_decode.test_spec_decode import NGRAM, greedy, run_pipeline
from tests.unit.gpu_worker.spec_decode.test_spec_decode import PROMPTS as SPEC_PROMPTS
from tests.unit.gpu_worker.test_decoder import MAX_TOKENS, greedy_requests_equal_generate
from tests.unit.gpu_worker.test_model_runner import make_requests, make_runner, run_to_completion


@pytest.fixture(scope="module", autouse=True)
def _few_threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def compiled(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRunner, Path]:
    """A runner whose forward was compiled (by its profiling step) into a cache of its own."""
    cache_dir = tmp_path_factory.mktemp("inductor")
    counters.clear()
    return make_runner(tiny_model_dir, compile=True, compile_cache_dir=str(cache_dir)), cache_dir


def test_compiled_decoder_equals_generate_and_compiles_once(
    compiled: tuple[ModelRunner, Path], tiny_model_dir: Path
) -> None:
    runner, _ = compiled
    assert isinstance(runner.model, Decoder) and isinstance(runner.model.run, PrecompiledForward)
    assert not runner.model.run.loaded  # its cache was empty
    greedy_requests_equal_generate(runner, tiny_model_dir)
    # One graph for every step shape (1 or many tokens, 0, 1 or many sampled rows): the file holds
    # one, and with no dynamo between a call and the graph, a step cannot compile another.
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_int8_compiled_equals_int8_eager(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The compiled graph takes the packed int8 GEMM as an opaque op: same tokens as eager int8."""
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in MAX_TOKENS]
    outputs = []
    for compiled in (False, True):
        runner = make_runner(
            tiny_model_dir, quantization="int8", compile=compiled, compile_cache_dir=str(tmp_path)
        )
        requests = make_requests(params)
        run_to_completion(runner, requests, preempt={})
        outputs.append([r.outputs for r in requests])
    assert outputs[0] == outputs[1]


_START_AND_REPORT = """
import sys, torch
from torch._dynamo.utils import counters
from tests.unit.gpu_worker.test_model_runner import make_runner
torch.set_num_threads(1)
runner = make_runner(sys.argv[1], compile=True, compile_cache_dir=sys.argv[2])
print(runner.model.run.loaded, counters["stats"]["unique_graphs"])
"""


def _start_in_new_process(model_dir: Path, cache_dir: Path) -> list[str]:
    """Whether a worker started in a new process loaded its compiled forward, and how many graphs
    it compiled."""
    run = subprocess.run(
        [sys.executable, "-c", _START_AND_REPORT, str(model_dir), str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.split()[-2:]


def test_a_restarted_worker_loads_its_compiled_forward(
    compiled: tuple[ModelRunner, Path], tiny_model_dir: Path
) -> None:
    """A new process with the same model and cache directory traces and compiles nothing."""
    _, cache_dir = compiled
    assert _start_in_new_process(tiny_model_dir, cache_dir) == ["True", "0"]


def test_a_changed_forward_is_compiled_again(
    compiled: tuple[ModelRunner, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The file records the source lines it was traced from: a copy of the cache whose record of
    one of them differs (as after an edit of the decoder) is compiled again, not trusted."""
    _, cache_dir = compiled
    edited = tmp_path / "edited"
    shutil.copytree(cache_dir, edited)
    (path,) = (edited / "precompiled").glob("*.bin")
    # The checksum of `logits_of`'s lines, as recorded; another one, as if they had been edited since.
    recorded = hashlib.sha256(inspect.getsource(Decoder.logits_of).encode()).hexdigest().encode()
    data = path.read_bytes()
    assert data.count(recorded) == 1
    path.write_bytes(data.replace(recorded, hashlib.sha256(b"an edited forward").hexdigest().encode()))
    assert _start_in_new_process(tiny_model_dir, edited) == ["False", "1"]


def test_steps_with_drafts_run_the_same_graph(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A step with drafts keeps more rows than it samples (gathered under inference mode): the graph
    compiled at load runs it, no recompilation in the middle of serving."""
    torch._dynamo.reset()  # else the graph of another test's runner of this model may serve this one
    counters.clear()
    params = [greedy(m) for m in SPEC_MAX_TOKENS]
    outputs, stats = run_pipeline(
        tiny_model_dir, NGRAM, params, compile=True, compile_cache_dir=str(tmp_path)
    )
    assert stats.spec_decode_num_draft_tokens > 0
    assert outputs == reference_greedy(tiny_model_dir, SPEC_PROMPTS, SPEC_MAX_TOKENS)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
