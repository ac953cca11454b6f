"""The benchmark tool: its generators (unit) and one short run against the static-batching baseline."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.figures.metrics import parse_goodput, summarize
from benchmarks.load.arrivals import arrival_times
from benchmarks.load.client import RequestOutput
from benchmarks.load.specs import SystemSpec, parse_launch_arg
from benchmarks.load.sse import SSEParser
from benchmarks.serve import main as serve_main
from benchmarks.workloads.datasets import DatasetConfig, ideal_cached_tokens, length_range, sample_requests
from benchmarks.workloads.tokenizer import BenchTokenizer

NUM_REQUESTS = 6


def _config(**overrides: object) -> DatasetConfig:
    base: dict[str, object] = {
        "name": "random",
        "num_prompts": 50,
        "seed": 7,
        "input_len": 20,
        "output_len": 10,
        "range_ratio": 0.5,
    }
    return DatasetConfig(**{**base, **overrides})  # type: ignore[arg-type]


def test_same_seed_gives_the_identical_request_list(tiny_model_dir: Path) -> None:
    tokenizer = BenchTokenizer(tiny_model_dir)
    for name in ("random", "capped-exponential"):
        first = sample_requests(_config(name=name), tokenizer)
        assert first == sample_requests(_config(name=name), tokenizer)
        assert first != sample_requests(_config(name=name, seed=8), tokenizer)
    assert arrival_times(50, 4.0, 0.5, seed=3) == arrival_times(50, 4.0, 0.5, seed=3)


def test_random_lengths_stay_in_range_and_ids_avoid_special_tokens(tiny_model_dir: Path) -> None:
    tokenizer = BenchTokenizer(tiny_model_dir)
    requests = sample_requests(_config(num_prompts=200), tokenizer)
    assert length_range(20, 0.5) == (10, 30)
    assert all(10 <= r.prompt_len <= 30 and 5 <= r.output_len <= 15 for r in requests)
    ids = {t for r in requests for t in r.prompt_token_ids}
    assert tokenizer.special_ids and not ids & tokenizer.special_ids
    assert max(ids) < tokenizer.vocab_size


def test_capped_exponential_respects_the_cap(tiny_model_dir: Path) -> None:
    config = _config(name="capped-exponential", num_prompts=2000, output_mean=40.0, output_cap=60)
    outputs = np.array([r.output_len for r in sample_requests(config, BenchTokenizer(tiny_model_dir))])
    assert outputs.min() >= 1 and outputs.max() == 60
    # Exponential with mean 40 capped at 60: E[min(X, 60)] = 40 (1 - e^-1.5) ~ 31.1.
    assert 28 < outputs.mean() < 34


def test_prefix_repetition_spreads_requests_over_shared_prefixes(tiny_model_dir: Path) -> None:
    config = _config(
        name="prefix-repetition",
        num_prompts=12,
        prefix_len=32,
        suffix_len=5,
        num_prefixes=3,
        prefix_output_len=7,
    )
    requests = sample_requests(config, BenchTokenizer(tiny_model_dir))
    assert all(r.prompt_len == 37 and r.output_len == 7 for r in requests)
    prefixes = [tuple(r.prompt_token_ids[:32]) for r in requests]
    assert len(set(prefixes)) == 3 and all(prefixes.count(p) == 4 for p in prefixes)
    # Each prefix's 2 blocks of 16 are computed once: the 9 later requests find them.
    assert ideal_cached_tokens(requests, 16) == 9 * 32


def test_multi_turn_resends_each_conversations_history(tiny_model_dir: Path) -> None:
    config = _config(name="multi-turn", num_prompts=6, input_len=20, output_len=4, turns=3, turn_len=6)
    requests = sample_requests(config, BenchTokenizer(tiny_model_dir))
    first, second, third = requests[0:2], requests[2:4], requests[4:6]  # 2 conversations, by turn
    for c in range(2):
        assert second[c].prompt_token_ids[:20] == first[c].prompt_token_ids
        assert third[c].prompt_token_ids[:30] == second[c].prompt_token_ids
        assert (first[c].prompt_len, second[c].prompt_len, third[c].prompt_len) == (20, 30, 40)
    # With blocks of 10: turn 2 finds 2 blocks of turn 1's prompt, turn 3 finds 2 more (39 // 10 = 3).
    assert ideal_cached_tokens(requests, 10) == 2 * (20 + 30)


def test_long_prompts_replace_a_seeded_share_and_leave_the_rest(tiny_model_dir: Path) -> None:
    tokenizer = BenchTokenizer(tiny_model_dir)
    base = sample_requests(_config(num_prompts=40), tokenizer)
    mixed = sample_requests(
        _config(num_prompts=40, long_prompt_len=300, long_prompt_fraction=0.1, max_model_len=305), tokenizer
    )
    long = [i for i, r in enumerate(mixed) if r.prompt_len == 300]
    assert len(long) == 4  # 10% of 40
    # Only the chosen requests change; their outputs are cut so prompt + output fits the model.
    assert all(mixed[i] == base[i] for i in range(40) if i not in long)
    assert all(mixed[i].output_len == min(base[i].output_len, 5) for i in long)
    again = sample_requests(
        _config(num_prompts=40, long_prompt_len=300, long_prompt_fraction=0.1, max_model_len=305), tokenizer
    )
    assert again == mixed
    with pytest.raises(ValueError, match="long-prompt-len"):
        sample_requests(_config(long_prompt_len=300, long_prompt_fraction=0.1, max_model_len=300), tokenizer)


def test_sharegpt_takes_reply_lengths_capped(tiny_model_dir: Path, tmp_path: Path) -> None:
    tokenizer = BenchTokenizer(tiny_model_dir)
    reply = "the value of the object is returned " * 10
    convs = [
        {
            "conversations": [
                {"from": "human", "value": f"question {i} about the module"},
                {"from": "gpt", "value": reply},
            ]
        }
        for i in range(5)
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs))
    requests = sample_requests(
        _config(name="sharegpt", num_prompts=5, sharegpt_path=str(path), output_cap=30), tokenizer
    )
    assert len(requests) == 5
    assert all(r.output_len == min(len(tokenizer.encode(reply)), 30) for r in requests)


def test_poisson_arrivals_have_the_requested_rate() -> None:
    rate, num = 5.0, 4000
    times = np.array(arrival_times(num, rate, burstiness=1.0, seed=1))
    gaps = np.diff(times)
    assert math.isclose(num / times[-1], rate, rel_tol=1e-9)
    # The first half, before the end point is pinned, already runs near the rate.
    assert abs(len(times[: num // 2]) / times[num // 2] - rate) < 0.1 * rate
    # Exponential gaps have a coefficient of variation of 1; Gamma(4) ones 1/2.
    assert 0.9 < gaps.std() / gaps.mean() < 1.1
    smooth = np.diff(arrival_times(num, rate, burstiness=4.0, seed=1))
    assert 0.45 < smooth.std() / smooth.mean() < 0.55
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]


def test_sse_parser_joins_split_events() -> None:
    parser = SSEParser()
    assert parser.feed(b'id: 1-0\ndata: {"a"') == []
    assert parser.feed(b": 1}\n\n: ping\n\ndata: [DONE]\r\n\r\n") == ['{"a": 1}', "[DONE]"]


def test_summary_follows_vllm_definitions() -> None:
    fast = RequestOutput(success=True, prompt_len=4, output_len=5, output_tokens=5, ttft=0.1, latency=0.5)
    fast.itl = [0.1] * 4
    slow = RequestOutput(success=True, prompt_len=4, output_len=5, output_tokens=5, ttft=1.0, latency=3.0)
    failed = RequestOutput(error="boom")
    summary = summarize([fast, slow, failed], 2.0, [50.0, 99.0], parse_goodput(["ttft:500", "tpot:200"]))
    assert summary["completed"] == 2 and summary["failed"] == 1
    assert summary["output_throughput"] == 5.0
    assert math.isclose(summary["mean_tpot_ms"], (100.0 + 500.0) / 2)  # (e2e - ttft) / (tokens - 1)
    assert summary["request_goodput"] == 0.5  # only `fast` meets both SLOs
    assert "p99_itl_ms" in summary and summary["num_output_len_mismatch"] == 0
    with pytest.raises(ValueError, match="goodput"):
        parse_goodput(["latency:5"])


@pytest.fixture(scope="module")
def static_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The baseline started the way compare mode starts it (and stopped the same way)."""
    from benchmarks.load.systems import launched

    system: SystemSpec = parse_launch_arg("static=static:batch_size=4,batch_timeout_ms=20,num_threads=1")
    with launched(system, str(tiny_model_dir), tmp_path_factory.mktemp("static-logs")) as base_url:
        yield base_url


def _load_args(tiny_model_dir: Path) -> list[str]:
    return [
        "--model",
        str(tiny_model_dir),
        "--num-prompts",
        str(NUM_REQUESTS),
        "--random-input-len",
        "12",
        "--random-output-len",
        "6",
        "--random-range-ratio",
        "0.5",
        "--request-rate",
        "inf",
        "--percentiles",
        "50,99",
        "--goodput",
        "ttft:60000",
        "--disable-tqdm",
    ]


def test_load_generator_against_static_baseline(
    static_server: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    result_file = tmp_path / "result.json"
    code = serve_main(
        ["--base-url", static_server, *_load_args(tiny_model_dir), "--result-file", str(result_file)]
    )
    assert code == 0
    result = json.loads(result_file.read_text())
    summary, requests = result["summary"], result["requests"]
    assert summary["completed"] == NUM_REQUESTS and summary["failed"] == 0
    assert summary["num_output_len_mismatch"] == 0
    assert summary["total_output_tokens"] == sum(r["output_len"] for r in requests)
    for key in ("mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "p50_e2el_ms", "request_goodput"):
        assert summary[key] > 0, key
    assert len(requests) == NUM_REQUESTS
    for r in requests:
        assert r["success"] and r["error"] == ""
        assert r["output_tokens"] == r["output_len"]  # ignore_eos: exactly max_tokens
        assert r["ttft_s"] > 0 and r["e2el_s"] >= r["ttft_s"]
        # Not > 0: tokens that reach the client in one read are timed microseconds apart, and the
        # same instant on a coarse clock.
        tokens_after_first = r["output_tokens"] - 1
        assert math.isclose(r["tpot_s"] * tokens_after_first, r["e2el_s"] - r["ttft_s"], abs_tol=1e-9)
        assert len(r["itl_s"]) == r["output_tokens"] - 1 and all(g >= 0 for g in r["itl_s"])
    assert (
        result["config"]["num_prompts"] == NUM_REQUESTS and result["system"]["model"] == tiny_model_dir.name
    )


def test_compare_runs_every_system_on_the_same_requests(
    static_server: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result_file = tmp_path / "compare.json"
    argv = ["compare", "--system", f"a={static_server}", "--system", f"b={static_server}", "--repeat", "2"]
    assert serve_main([*argv, *_load_args(tiny_model_dir), "--result-file", str(result_file)]) == 0
    result = json.loads(result_file.read_text())
    a, b = result["systems"]["a"], result["systems"]["b"]
    shape = [(r["input_len"], r["output_len"]) for r in a["requests"]]
    assert shape == [(r["input_len"], r["output_len"]) for r in b["requests"]]
    assert result["baseline"] == "a" and result["ratios"]["b"]["total_output_tokens"] == 1.0
    assert result_file.with_suffix(".png").stat().st_size > 0
    # Two rounds, the second in reverse order; ratios are paired within a round.
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("--- ")]
    assert printed == ["--- a ---", "--- b ---", "--- b ---", "--- a ---"]
    assert [sorted(r) for r in result["rounds"]] == [["a", "b"], ["a", "b"]]
    tokens = result["ratio_spread"]["b"]["total_output_tokens"]
    assert tokens == {"median": 1.0, "min": 1.0, "max": 1.0}
    throughput = result["summary_spread"]["a"]["output_throughput"]
    measured = [r["a"]["output_throughput"] for r in result["rounds"]]
    assert throughput["min"] == min(measured) and throughput["max"] == max(measured)


def test_spec_file_settings_are_defaults_that_flags_override(tmp_path: Path) -> None:
    from benchmarks.serve import parse_args, resolve_systems

    spec = tmp_path / "spec.toml"
    spec.write_text(
        'model = "some/model"\nbaseline = "cb"\n[benchmark]\nnum_prompts = 40\nrequest_rate = 2.5\n'
        '[[system]]\nname = "static"\nlaunch = { kind = "static", batch_size = 8 }\n'
        '[[system]]\nname = "cb"\n'
        'launch = { kind = "cbserve", workers = 2, env = { BATCHER_MAX_NUM_SEQS = "8" } }\n'
    )
    args, compare = parse_args(
        ["compare", "--spec", str(spec), "--num-prompts", "3", "--system", "x=http://h:1"]
    )
    assert compare and args.num_prompts == 3 and args.request_rate == 2.5 and args.model == "some/model"
    systems, baseline = resolve_systems(args)
    assert baseline == "cb" and [s.name for s in systems] == ["static", "cb", "x"]
    assert systems[1].launch is not None and systems[1].launch.env == {"BATCHER_MAX_NUM_SEQS": "8"}
    hf = parse_launch_arg("hf=transformers:cb_num_blocks=64,OMP_NUM_THREADS=1")
    assert hf.backend == "transformers" and hf.prompt_format == "text"
    assert hf.launch is not None and hf.launch.env == {"OMP_NUM_THREADS": "1"}
    with pytest.raises(ValueError, match="unknown static option"):
        parse_launch_arg("s=static:batchsize=8")


def test_inprocess_engine_serves_the_same_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Our scheduler and model runner in one process (no Redis), as compare mode launches it."""
    from benchmarks.load.systems import launched

    system = parse_launch_arg("inproc=inprocess:num_threads=1,max_num_seqs=4,max_num_batched_tokens=16")
    result_file = tmp_path / "inprocess.json"
    with launched(system, str(tiny_model_dir), tmp_path / "logs") as base_url:
        code = serve_main(
            ["--base-url", base_url, *_load_args(tiny_model_dir), "--result-file", str(result_file)]
        )
    assert code == 0
    summary = json.loads(result_file.read_text())["summary"]
    assert summary["completed"] == NUM_REQUESTS and summary["failed"] == 0
    assert summary["num_output_len_mismatch"] == 0


def test_control_plane_reports_iterations_and_cpu_by_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The null-model pipeline (async scheduling only, to keep CI short): its row, with every
    process's CPU share."""
    from benchmarks.pipeline import control_plane

    result_file = tmp_path / "control-plane.json"
    argv = ["--model", str(tiny_model_dir), "--batch-sizes", "2", "--output-len", "200"]
    argv += ["--scheduling", "async"]
    control_plane.main([*argv, "--result-file", str(result_file)])
    rows = json.loads(result_file.read_text())
    assert [(r["batch_size"], r["async_scheduling"]) for r in rows] == [(2, True)]
    for row in rows:
        assert row["null_model"] and row["tokens"] == 400
        assert row["steps"] >= 200 and row["worker_step_ms"] > 0 and row["steady_ms_per_iteration"] > 0
        cpu = row["cpu_ms_per_iteration"]
        assert set(cpu) == {"redis", "batcher", "worker0", "gateway"}
        # /proc counts in 10 ms ticks: the gateway's few ms for two responses may read 0, the
        # busy loop's processes may not.
        assert all(ms >= 0 for ms in cpu.values()) and cpu["batcher"] > 0 and cpu["worker0"] > 0


def test_cell_specs_compare_the_same_workers_and_the_two_policies() -> None:
    from benchmarks.load.specs import load_spec_file

    specs = Path(__file__).resolve().parents[3] / "benchmarks" / "specs"
    cells = load_spec_file(specs / "cpu-cells.toml").systems
    shape = [(s.launch.options["cells"], s.launch.options["workers"]) for s in cells if s.launch]
    assert shape == [(1, 2), (2, 1)]
    routing = load_spec_file(specs / "cpu-cell-routing.toml")
    policies = [s.launch.env["GATEWAY_CELL_POLICY"] for s in routing.systems if s.launch]
    assert policies == ["random", "cache_aware"] and routing.benchmark["dataset"] == "prefix-repetition"


def test_cbserve_launch_with_two_cells_serves_from_both(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`cells = 2` starts a batcher and `workers` workers per cell behind one gateway, which places
    the load in both (idle cells take turns)."""
    import redis

    from benchmarks.load.specs import LaunchSpec
    from benchmarks.load.systems import ProcessGroup, _start_cbserve, free_port
    from common.streams import cell_keys
    from harness.processes.services import wait_for

    group = ProcessGroup("cells", tmp_path / "logs", {})
    port = free_port()
    try:
        launch = LaunchSpec("cbserve", {"cells": 2, "workers": 1, "num_threads": 1}, startup_timeout_s=240)
        _start_cbserve(group, launch, str(tiny_model_dir), port)
        names = ["cell0-batcher", "cell0-worker0", "cell1-batcher", "cell1-worker0", "gateway", "redis"]
        assert sorted(group.procs) == names
        argv = ["--base-url", f"http://127.0.0.1:{port}", *_load_args(tiny_model_dir), "--num-warmups", "0"]
        assert serve_main([*argv, "--result-file", str(tmp_path / "cells.json")]) == 0
        assert group.redis_url is not None
        with redis.Redis.from_url(group.redis_url) as client:

            def finished() -> list[float]:
                counts = [client.hget(cell_keys(cell).stats, "num_finished") for cell in ("cell0", "cell1")]
                return [float(count or 0) for count in counts]

            wait_for(lambda: sum(finished()) == NUM_REQUESTS, 30, "both batchers to count the load finished")
            assert min(finished()) > 0, finished()
    finally:
        group.stop()


def test_control_plane_cells_reports_cpu_by_cell(tool_model_dir: Path, tmp_path: Path) -> None:
    """Two cells of one null worker behind two gateways: a row per cell over the window with every
    request running, each with its own batcher's and workers' CPU, and the shared parts' CPU.

    The model with the longer context, so that 2000 tokens a request leave room for the placement of
    the last request under the suite's load (at 500, one request finished first in a full run)."""
    from benchmarks.pipeline import control_plane

    result_file = tmp_path / "cells.json"
    argv = ["--model", str(tool_model_dir), "--batch-sizes", "4", "--output-len", "2000"]
    argv += ["--scheduling", "async", "--cells", "2", "--workers-per-cell", "1", "--gateways", "2"]
    control_plane.main([*argv, "--result-file", str(result_file)])
    (row,) = json.loads(result_file.read_text())
    assert (row["cells"], row["workers_per_cell"], row["gateways"], row["requests"]) == (2, 1, 2, 8)
    by_cell = row["by_cell"]
    assert [c["cell"] for c in by_cell] == ["cell0", "cell1"]
    # The requests were all placed before the window (the stats may still show one waiting).
    assert 0 < sum(c["running"] for c in by_cell) <= 8
    assert 0 < row["window_s"] < row["wall_s"]
    for cell in by_cell:
        assert cell["running"] > 0 and cell["steps"] > 0
        assert cell["batcher_ms_per_step"] > 0 and cell["worker_ms_per_step"] > 0
        assert cell["batcher_us_per_token"] > 0 and cell["worker_us_per_token"] > 0
    totals = row["totals"]
    assert totals["gateway_us_per_token"] > 0 and totals["redis_us_per_token"] > 0
    assert set(totals["gateway_cpu_s"]) == {"gateway0", "gateway1"}
    assert row["busy"]["pipeline_cores"] > 0 and row["busy"]["pss_mib"] > 0
