"""Load generator for OpenAI-compatible servers, after `vllm bench serve`; `compare` runs several.

One server:
    python -m benchmarks.serve --base-url http://127.0.0.1:8000 --model models/tiny-llama \\
        --dataset random --random-input-len 128 --random-output-len 64 --num-prompts 100 --request-rate 4

Several, on the identical request list (same prompts, lengths and arrival times), one after another:
    python -m benchmarks.serve compare --model models/tiny-llama \\
        --launch static=static:batch_size=8 --launch cbserve=cbserve --system vllm=http://gpu:8000
    python -m benchmarks.serve compare --spec benchmarks/specs/cpu-tiny.toml

Every run writes a JSON result (config, summary, per-request figures); compare also prints the
ratios of each system to the baseline and writes a PNG of TTFT / TPOT / throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.figures.metrics import Summary, parse_goodput, summarize
from benchmarks.figures.report import format_comparison, format_summary, ratios, run_record, write_json
from benchmarks.load.arrivals import arrival_times
from benchmarks.load.client import BACKENDS
from benchmarks.load.runner import RunOptions, Target, run
from benchmarks.load.spec_decode import summary_fields as spec_summary_fields
from benchmarks.load.specs import (
    PROMPT_FORMATS,
    SystemSpec,
    load_spec_file,
    parse_launch_arg,
    parse_system_arg,
)
from benchmarks.workloads.datasets import (
    DATASETS,
    DatasetConfig,
    SampleRequest,
    ideal_cached_tokens,
    sample_requests,
)
from benchmarks.workloads.tokenizer import BenchTokenizer

DEFAULT_RESULT_DIR = Path(__file__).resolve().parent / "results"


class _AppendSystem(argparse.Action):
    """--system and --launch append to one list, so systems run in command-line order."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, _: Any = None
    ) -> None:
        systems = list(getattr(namespace, "systems", None) or [])
        systems.append((self.option_strings[0], values))
        namespace.systems = systems


def _add_benchmark_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model directory: its tokenizer.json draws and renders prompts")
    data = parser.add_argument_group("dataset")
    data.add_argument("--dataset", choices=DATASETS, default="random")
    data.add_argument("--dataset-path", help="sharegpt: a ShareGPT-format JSON file")
    data.add_argument("--num-prompts", type=int, default=100)
    data.add_argument("--seed", type=int, default=0, help="one seed for prompts, lengths and arrivals")
    data.add_argument("--random-input-len", type=int, default=1024, help="random, capped-exponential")
    data.add_argument("--random-output-len", type=int, default=128, help="random")
    data.add_argument(
        "--random-range-ratio", type=float, default=0.0, help="lengths uniform in [L(1-r), L(1+r)]"
    )
    data.add_argument("--output-mean", type=float, default=128.0, help="capped-exponential: mean output")
    data.add_argument("--output-cap", type=int, default=1024, help="capped-exponential, sharegpt: max output")
    data.add_argument(
        "--max-model-len", type=int, default=2048, help="sharegpt, long prompts: prompt + output limit"
    )
    data.add_argument("--long-prompt-len", type=int, default=0, help="mix in prompts of this many tokens")
    data.add_argument("--long-prompt-fraction", type=float, default=0.0, help="share of long-prompt requests")
    data.add_argument("--prefix-repetition-prefix-len", type=int, default=256, help="prefix-repetition")
    data.add_argument("--prefix-repetition-suffix-len", type=int, default=256, help="prefix-repetition")
    data.add_argument("--prefix-repetition-num-prefixes", type=int, default=10, help="prefix-repetition")
    data.add_argument("--prefix-repetition-output-len", type=int, default=128, help="prefix-repetition")
    data.add_argument("--multi-turn-turns", type=int, default=4, help="multi-turn: requests per conversation")
    data.add_argument("--multi-turn-turn-len", type=int, default=64, help="multi-turn: tokens each turn adds")
    data.add_argument(
        "--cache-block-size", type=int, default=16, help="block size of the ideal-cache figure in results"
    )
    load = parser.add_argument_group("load")
    load.add_argument("--request-rate", type=float, default=math.inf, help="requests/s; inf: all at t=0")
    load.add_argument("--burstiness", type=float, default=1.0, help="1: Poisson; else Gamma gaps")
    load.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    req = parser.add_argument_group("requests")
    req.add_argument("--temperature", type=float, default=0.0)
    req.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    req.add_argument("--extra-body", type=json.loads, default={}, help="JSON merged into every body")
    req.add_argument("--num-warmups", type=int, default=1, help="untimed requests sent first")
    req.add_argument("--request-timeout", type=float, default=6 * 3600.0, help="seconds per request")
    out = parser.add_argument_group("metrics and output")
    out.add_argument("--percentiles", default="99", help="comma-separated, e.g. 50,90,99")
    out.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    out.add_argument("--result-file", type=Path, help="JSON result path (default: under --result-dir)")
    out.add_argument("--result-dir", type=Path, default=DEFAULT_RESULT_DIR)
    out.add_argument("--label", default="", help="goes into the result's name and config")
    out.add_argument("--disable-tqdm", action="store_true")


def build_parser(compare: bool) -> argparse.ArgumentParser:
    prog = "python -m benchmarks.serve" + (" compare" if compare else "")
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    target = parser.add_argument_group("target")
    target.add_argument("--backend", choices=BACKENDS, default="openai", help="request dialect")
    target.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="ids", help="ids, or detokenized")
    if compare:
        target.add_argument("--spec", type=Path, help="TOML/JSON file of systems and settings")
        target.add_argument("--system", action=_AppendSystem, metavar="NAME=URL", help="a running server")
        target.add_argument(
            "--launch", action=_AppendSystem, metavar="NAME=KIND[:k=v,...]", help="a server to start"
        )
        target.add_argument("--baseline", help="system the ratios divide by (default: the first)")
        target.add_argument("--only", help="comma-separated names: run just these of the spec's systems")
        target.add_argument("--plot", type=Path, help="PNG path (default: next to the result file)")
        target.add_argument("--log-dir", type=Path, help="launched servers' logs (default: result dir)")
        target.add_argument(
            "--roofline",
            action=argparse.BooleanOptionalAction,
            default=False,
            help="measure this machine's copy bandwidth and GEMM peak first; print each system's share",
        )
        target.add_argument("--roofline-threads", type=int, default=2, help="threads of that measurement")
        target.add_argument(
            "--repeat",
            type=int,
            default=1,
            help="rounds of every system (order reversed every other round); medians, paired-ratio ranges",
        )
    else:
        target.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
        target.add_argument("--served-model-name", help="`model` to send (default: first of /v1/models)")
        target.add_argument(
            "--lora-modules",
            nargs="+",
            default=[],
            metavar="NAME",
            help="adapters the requests are spread over",
        )
    _add_benchmark_args(parser)
    return parser


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, bool]:
    compare = bool(argv) and argv[0] == "compare"
    argv = argv[1:] if compare else argv
    parser = build_parser(compare)
    args = parser.parse_args(argv)
    if compare and args.spec is not None:
        # The spec file's settings become defaults, so flags on the command line still win.
        spec = load_spec_file(args.spec)
        known = {a.dest for a in parser._actions}
        unknown = set(spec.benchmark) - known
        if unknown:
            parser.error(f"{args.spec}: unknown [benchmark] setting(s) {sorted(unknown)}")
        parser.set_defaults(**spec.benchmark)
        if spec.model:
            parser.set_defaults(model=spec.model)
        args = parser.parse_args(argv)
    if not args.model:
        parser.error("--model is required (the model directory whose tokenizer.json shapes the prompts)")
    return args, compare


@dataclass(frozen=True, slots=True)
class Workload:
    requests: list[SampleRequest]
    arrivals: list[float]
    tokenizer: BenchTokenizer


def make_workload(args: argparse.Namespace) -> Workload:
    tokenizer = BenchTokenizer(args.model)
    config = DatasetConfig(
        name=args.dataset,
        num_prompts=args.num_prompts,
        seed=args.seed,
        input_len=args.random_input_len,
        output_len=args.random_output_len,
        range_ratio=args.random_range_ratio,
        output_mean=args.output_mean,
        output_cap=args.output_cap,
        sharegpt_path=args.dataset_path,
        max_model_len=args.max_model_len,
        long_prompt_len=args.long_prompt_len,
        long_prompt_fraction=args.long_prompt_fraction,
        prefix_len=args.prefix_repetition_prefix_len,
        suffix_len=args.prefix_repetition_suffix_len,
        num_prefixes=args.prefix_repetition_num_prefixes,
        prefix_output_len=args.prefix_repetition_output_len,
        turns=args.multi_turn_turns,
        turn_len=args.multi_turn_turn_len,
    )
    requests = sample_requests(config, tokenizer)
    arrivals = arrival_times(len(requests), args.request_rate, args.burstiness, args.seed)
    return Workload(requests, arrivals, tokenizer)


def run_options(args: argparse.Namespace) -> RunOptions:
    return RunOptions(
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        max_concurrency=args.max_concurrency,
        num_warmups=args.num_warmups,
        request_timeout_s=args.request_timeout,
        progress=not args.disable_tqdm,
        extra_body=args.extra_body,
    )


def percentiles(args: argparse.Namespace) -> list[float]:
    return [float(p) for p in str(args.percentiles).split(",") if p.strip()]


def _git_commit() -> str | None:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() or None


def config_record(args: argparse.Namespace, workload: Workload) -> dict[str, Any]:
    config = {
        k: (str(v) if isinstance(v, Path) or v in (math.inf, -math.inf) else v) for k, v in vars(args).items()
    }
    for key in ("systems", "system", "launch"):  # compare's system list is recorded as system_specs
        config.pop(key, None)
    config["date"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    config["git_commit"] = _git_commit()
    requests = workload.requests
    config["workload"] = {
        "num_requests": len(requests),
        "mean_input_len": sum(r.prompt_len for r in requests) / len(requests),
        "mean_output_len": sum(r.output_len for r in requests) / len(requests),
        "last_arrival_s": workload.arrivals[-1],
        # What an unbounded prefix cache of whole blocks could serve: compare cached_input_tokens.
        "ideal_cached_input_tokens": ideal_cached_tokens(requests, args.cache_block_size),
    }
    return config


def _describe(workload: Workload) -> str:
    c = workload.requests
    return (
        f"{len(c)} requests, input {min(r.prompt_len for r in c)}-{max(r.prompt_len for r in c)} tokens, "
        f"output {min(r.output_len for r in c)}-{max(r.output_len for r in c)} tokens, "
        f"last arrival at {workload.arrivals[-1]:.2f}s"
    )


def benchmark_one(
    target: Target, workload: Workload, args: argparse.Namespace
) -> tuple[dict[str, Any], Summary]:
    result = asyncio.run(
        run(target, workload.requests, workload.arrivals, run_options(args), workload.tokenizer)
    )
    summary = summarize(result.outputs, result.duration_s, percentiles(args), parse_goodput(args.goodput))
    if result.spec_decode is not None:
        summary.update(spec_summary_fields(result.spec_decode))
    failures = [o.error for o in result.outputs if not o.success]
    for error in failures[:5]:
        print(f"[{target.name}] failed request: {error.strip()[:300]}", file=sys.stderr)
    print(format_summary(target.name, summary, percentiles(args), result))
    return run_record(result, summary), summary


def _result_path(args: argparse.Namespace, kind: str) -> Path:
    if args.result_file is not None:
        return Path(args.result_file)
    label = f"-{args.label}" if args.label else ""
    return Path(args.result_dir) / f"{kind}{label}-{time.strftime('%Y%m%d-%H%M%S')}.json"


def main_single(args: argparse.Namespace) -> int:
    parse_goodput(args.goodput)  # fail on a bad SLO before any load is sent
    workload = make_workload(args)
    print(_describe(workload))
    target = Target(
        "server",
        args.base_url,
        args.backend,
        args.prompt_format,
        args.served_model_name,
        lora_modules=tuple(args.lora_modules),
    )
    record, summary = benchmark_one(target, workload, args)
    path = _result_path(args, "serve")
    write_json(path, {"config": config_record(args, workload), **record})
    print(f"result: {path}")
    return 0 if summary["failed"] == 0 else 1


def resolve_systems(args: argparse.Namespace) -> tuple[list[SystemSpec], str]:
    systems: list[SystemSpec] = []
    baseline = args.baseline
    if args.spec is not None:
        spec = load_spec_file(args.spec)
        systems.extend(spec.systems)
        baseline = baseline or spec.baseline
    for flag, value in getattr(args, "systems", None) or []:
        if flag == "--system":
            systems.append(parse_system_arg(value, args.backend, args.prompt_format))
        else:
            systems.append(parse_launch_arg(value))
    if args.only:
        keep = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = set(keep) - {s.name for s in systems}
        if unknown:
            raise SystemExit(f"--only names systems that are not defined: {sorted(unknown)}")
        systems = [s for s in systems if s.name in keep]
        if baseline not in keep:
            baseline = None
    names = [s.name for s in systems]
    if not systems:
        raise SystemExit("compare needs systems: --system NAME=URL, --launch NAME=KIND, or --spec FILE")
    if len(set(names)) != len(names):
        raise SystemExit(f"system names must be unique: {names}")
    baseline = baseline or names[0]
    if baseline not in names:
        raise SystemExit(f"--baseline {baseline!r} is not one of {names}")
    return systems, baseline


def main_compare(args: argparse.Namespace) -> int:
    from benchmarks.bounds.roofline import measure_machine
    from benchmarks.bounds.roofline import report as roofline_report
    from benchmarks.figures.plot import plot_comparison
    from benchmarks.figures.repeats import format_repeated, ratio_spread, round_order, summary_spread
    from benchmarks.load.systems import launched

    parse_goodput(args.goodput)
    if args.repeat < 1:
        raise ValueError("--repeat must be at least 1")
    systems, baseline = resolve_systems(args)
    by_name = {s.name: s for s in systems}
    workload = make_workload(args)
    print(_describe(workload))
    # Measured before any server starts, on a quiet machine, with the servers' thread count.
    machine = measure_machine(args.roofline_threads) if args.roofline else None
    path = _result_path(args, "compare")
    log_dir = Path(args.log_dir) if args.log_dir else path.with_suffix("").with_name(path.stem + "-logs")
    records: dict[str, dict[str, Any]] = {}  # each system's first measured run, with per-request figures
    rounds: list[dict[str, Summary]] = []
    errors: dict[str, str] = {}
    for round_index in range(args.repeat):
        if args.repeat > 1:
            print(f"=== round {round_index + 1} of {args.repeat} ===", flush=True)
        summaries: dict[str, Summary] = {}
        for name in round_order(list(by_name), round_index):
            system = by_name[name]
            print(f"--- {system.name} ---", flush=True)
            # `transformers serve` must be sent the model exactly as it was started with.
            hf_launch = system.launch is not None and system.launch.kind == "transformers"
            model_name = system.model or (str(args.model) if hf_launch else None)
            run_log_dir = log_dir / f"round-{round_index + 1}" if args.repeat > 1 else log_dir
            try:
                with launched(system, str(args.model), run_log_dir) as base_url:
                    target = Target(
                        system.name,
                        base_url,
                        system.backend,
                        system.prompt_format,
                        model_name,
                        system.extra_body,
                        system.lora_modules,
                    )
                    record, summaries[name] = benchmark_one(target, workload, args)
                    records.setdefault(name, record)
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
                print(f"[{system.name}] not measured: {errors[name]}", file=sys.stderr)
        # Spec order in the tables and the JSON, whatever order the round ran in.
        rounds.append({n: summaries[n] for n in by_name if n in summaries})
        if baseline in summaries:
            print()
            print(format_comparison(rounds[-1], baseline, percentiles(args)))
    result: dict[str, Any] = {
        "config": config_record(args, workload),
        "system_specs": [asdict(s) for s in systems],
        "baseline": baseline,
        "systems": records,
    }
    if errors:
        result["errors"] = errors
    if baseline in rounds[0]:
        result["ratios"] = ratios(rounds[0], baseline)
    if args.repeat > 1:
        measured = [n for n in by_name if all(n in r for r in rounds)]
        spreads = {n: summary_spread([r[n] for r in rounds]) for n in measured}
        paired = ratio_spread([{n: r[n] for n in measured} for r in rounds], baseline)
        result["rounds"] = rounds
        result["summary_spread"] = spreads
        result["ratio_spread"] = paired
        if baseline in measured:
            print()
            print(format_repeated(spreads, paired, baseline, percentiles(args), args.repeat))
    if machine is not None:
        print()
        num_requests = len(workload.requests)  # the most that can be in flight
        batch = min(args.max_concurrency or num_requests, num_requests)
        result["roofline"] = roofline_report(args.model, systems, rounds, machine, batch, workload.requests)
    write_json(path, result)
    print(f"result: {path}")
    if records:
        plot_path = Path(args.plot) if args.plot else path.with_suffix(".png")
        title = f"{args.dataset}, {len(workload.requests)} requests, rate {args.request_rate}"
        try:
            print(f"plot: {plot_comparison(records, plot_path, title)}")
        except ImportError as exc:  # a host without matplotlib (the GPU check's) still gets its results
            print(f"plot: skipped ({exc})", file=sys.stderr)
    failed = any(s["failed"] for r in rounds for s in r.values())
    return 1 if errors or failed else 0


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (a `timeout`, a CI runner) must still stop the servers a comparison launched: turning it
    # into SystemExit runs the `finally` that stops them; Python's default would just end the process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args, compare = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return main_compare(args) if compare else main_single(args)
    except (OSError, ValueError, RuntimeError, aiohttp.ClientError) as exc:
        # Bad settings or an unreachable server: one line, not a traceback.
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
