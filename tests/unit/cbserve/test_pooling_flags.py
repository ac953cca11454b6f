"""vLLM's `--runner` / `--convert` flags: `cbserve up` hands them to every worker, and the worker's own
`--convert embed` makes a chat checkpoint an embedding model (the pooling runner, last token)."""

from __future__ import annotations

from pathlib import Path

from cbserve.__main__ import _options, build_parser
from cbserve.launcher import UpOptions
from cbserve.stack import ServiceArgs, worker_argv
from gpu_worker.__main__ import parse_args
from gpu_worker.runner.pooling.model_files import resolve_runner
from gpu_worker.settings import WorkerSettings


def test_cbserve_up_passes_runner_and_convert_to_every_worker(tmp_path: Path) -> None:
    opts = _options(UpOptions, build_parser().parse_args(["up", "--convert", "embed"]))
    assert (opts.runner, opts.convert) == (None, "embed")
    base = ({"default": tmp_path}, "cpu", "redis://x", "127.0.0.1", 8000, False)
    assert "--convert" not in worker_argv(tmp_path, ServiceArgs(*base))
    args = ServiceArgs(*base, runner=opts.runner, convert=opts.convert)
    assert worker_argv(tmp_path, args)[-2:] == ["--convert", "embed"]


def test_the_workers_convert_flag_makes_a_chat_model_a_pooling_one(tiny_model_dir: Path) -> None:
    args = parse_args(["--model", str(tiny_model_dir), "--convert", "embed"])
    settings = WorkerSettings(**{k: v for k, v in vars(args).items() if v is not None})
    assert (settings.convert, resolve_runner(settings)) == ("embed", "pooling")
