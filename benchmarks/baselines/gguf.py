"""A benchmark model as GGUF for llama-server, converted by llama.cpp's own script and cached.

    python -m benchmarks.baselines.gguf models/gpt2-small-llama --outtype f32 --outtype q8_0
    # -> models/gpt2-small-llama/gguf/f32.gguf, .../q8_0.gguf

A file is converted when it is missing or older than the model's weights, else reused: the
`llama-server` launch kind (benchmarks/load/systems.py) calls `ensure_gguf` before it starts the server.
The script (convert_hf_to_gguf.py) and its `gguf` package come from the llama.cpp source tree that
benchmarks/baselines/llama_server.sh unpacks into .llama/src, so the file format is the one the server
built from that tree reads; benchmarks/baselines/llama_convert.py runs it (the benchmark models' tokenizer
is unknown to its table). `q8_0` is llama.cpp's 8-bit block format: 32 weights share one fp16 scale.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LLAMA_SRC = ROOT / ".llama" / "src"
OUTTYPES = ("f32", "f16", "bf16", "q8_0")
# Bytes a weight of each type takes (q8_0: 32 int8 values and an fp16 scale per block).
BYTES_PER_WEIGHT = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32}


def gguf_path(model_dir: Path, outtype: str) -> Path:
    return Path(model_dir) / "gguf" / f"{outtype}.gguf"


def is_current(path: Path, model_dir: Path) -> bool:
    """`path` exists and is newer than every weight file of the model."""
    if not path.is_file():
        return False
    weights = [*Path(model_dir).glob("*.safetensors"), Path(model_dir) / "config.json"]
    return all(path.stat().st_mtime >= w.stat().st_mtime for w in weights if w.exists())


def converter_command(model_dir: Path, outtype: str, outfile: Path, src: Path = LLAMA_SRC) -> list[str]:
    script = src / "convert_hf_to_gguf.py"
    argv = [sys.executable, "-m", "benchmarks.baselines.llama_convert", str(script), str(model_dir)]
    return [*argv, "--outtype", outtype, "--outfile", str(outfile)]


def converter_env(src: Path = LLAMA_SRC) -> dict[str, str]:
    """The tree's gguf-py first (the version the server reads), then the script's own package."""
    paths = [str(src / "gguf-py"), str(src), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def ensure_gguf(model_dir: str | Path, outtype: str, src: Path = LLAMA_SRC) -> Path:
    """The model's GGUF file of `outtype`, converted first if missing or stale."""
    if outtype not in OUTTYPES:
        raise ValueError(f"GGUF outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    model_dir = Path(model_dir).resolve()  # the converter runs in the repository root
    path = gguf_path(model_dir, outtype)
    if is_current(path, model_dir):
        return path
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{model_dir} has no config.json: python -m benchmarks.workloads.make_model makes one"
        )
    script = src / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise FileNotFoundError(
            f"{script} not found: bash benchmarks/baselines/llama_server.sh unpacks llama.cpp there"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")  # a killed conversion leaves no file that looks done
    started = time.perf_counter()
    done = subprocess.run(
        converter_command(model_dir, outtype, partial, src),
        cwd=ROOT,
        env=converter_env(src),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"converting {model_dir} to GGUF {outtype} failed:\n{done.stderr[-3000:]}")
    partial.replace(path)
    size_mb = path.stat().st_size / 2**20
    print(f"gguf: {path} ({size_mb:.0f} MiB) in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.baselines.gguf", description=__doc__.split("\n")[0]
    )
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--outtype", action="append", choices=OUTTYPES, help="repeatable (default: f32)")
    parser.add_argument("--llama-src", type=Path, default=LLAMA_SRC, help="the llama.cpp source tree")
    args = parser.parse_args(argv)
    for outtype in args.outtype or ["f32"]:
        print(ensure_gguf(args.model_dir, outtype, args.llama_src))


if __name__ == "__main__":
    main()
