"""The llama-server launch kind without the binary: its spec, its command line, its GGUF cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.baselines.gguf import LLAMA_SRC, converter_command, gguf_path, is_current
from benchmarks.baselines.llama_launch import DEFAULT_BINARY, LlamaServerOptions, server_command
from benchmarks.load.client import _is_token_chunk
from benchmarks.load.specs import load_spec_file, parse_launch_arg

SPECS = Path(__file__).resolve().parents[3] / "benchmarks" / "specs"


def _value_after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("spec", ["cpu-llama-server.toml", "cpu-llama-server-small.toml"])
def test_the_comparison_specs_start_llama_server_at_both_precisions(spec: str) -> None:
    loaded = load_spec_file(SPECS / spec)
    kinds = {s.name: s.launch.kind for s in loaded.systems if s.launch is not None}
    # The five systems (a spec may compare more).
    assert (
        kinds.items()
        >= {
            "llama-server-f32": "llama-server",
            "llama-server-q8_0": "llama-server",
            "cbserve": "cbserve",
            "cbserve-int8": "cbserve",
            "static-16": "static",
        }.items()
    )
    assert loaded.baseline == "llama-server-f32"
    assert loaded.benchmark["max_concurrency"] == 16 and loaded.benchmark["roofline"] is True
    by_name = {s.name: s for s in loaded.systems}
    assert by_name["cbserve-int8"].launch is not None
    assert by_name["cbserve-int8"].launch.env["WORKER_QUANTIZATION"] == "int8"
    for name, outtype in (("llama-server-f32", "f32"), ("llama-server-q8_0", "q8_0")):
        system = by_name[name]
        assert system.launch is not None and system.prompt_format == "ids" and system.backend == "openai"
        options = LlamaServerOptions.from_options(system.launch.options)
        assert (options.outtype, options.slots, options.threads) == (outtype, 16, 2)
        # Each slot holds the longest prompt (256) and the longest output (512) of the workload.
        assert options.ctx_size // options.slots >= 256 + 512


def test_the_command_line_names_the_gguf_the_slots_threads_and_context(tmp_path: Path) -> None:
    options = LlamaServerOptions.from_options(
        {"outtype": "q8_0", "slots": 16, "threads": 2, "ctx_per_slot": 1024}
    )
    gguf = gguf_path(tmp_path / "model", options.outtype)
    argv = server_command(options, gguf, 8123)
    assert argv[0] == str(DEFAULT_BINARY)
    assert _value_after(argv, "--model") == str(tmp_path / "model" / "gguf" / "q8_0.gguf")
    assert (_value_after(argv, "--host"), _value_after(argv, "--port")) == ("127.0.0.1", "8123")
    assert _value_after(argv, "--parallel") == "16" and "--cont-batching" in argv
    assert _value_after(argv, "--ctx-size") == str(16 * 1024)
    assert _value_after(argv, "--threads") == _value_after(argv, "--threads-batch") == "2"
    assert "--cache-type-k" not in argv  # the server's own KV type unless the spec names one
    f32_kv = server_command(LlamaServerOptions.from_options({"kv_type": "f32"}), gguf, 1)
    assert _value_after(f32_kv, "--cache-type-k") == _value_after(f32_kv, "--cache-type-v") == "f32"


def test_the_command_line_form_takes_string_values_and_bad_ones_fail_when_read() -> None:
    system = parse_launch_arg("peer=llama-server:outtype=q8_0,slots=4,threads=1")
    assert system.launch is not None and system.launch.kind == "llama-server"
    options = LlamaServerOptions.from_options(system.launch.options)
    assert (options.outtype, options.slots, options.threads, options.ctx_size) == ("q8_0", 4, 1, 4096)
    with pytest.raises(ValueError, match="outtype must be one of"):
        parse_launch_arg("peer=llama-server:outtype=q4_k")
    with pytest.raises(ValueError, match="slots must be at least 1"):
        parse_launch_arg("peer=llama-server:slots=0")
    with pytest.raises(ValueError, match="unknown llama-server option"):
        parse_launch_arg("peer=llama-server:batch_size=8")


def test_the_converter_is_llama_cpps_script_and_its_output_is_cached_until_the_weights_change(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    weights = model / "model.safetensors"
    weights.write_bytes(b"weights")
    out = gguf_path(model, "f32")
    argv = converter_command(model, "f32", out)
    assert argv[argv.index("benchmarks.baselines.llama_convert") + 1] == str(
        LLAMA_SRC / "convert_hf_to_gguf.py"
    )
    assert _value_after(argv, "--outtype") == "f32" and _value_after(argv, "--outfile") == str(out)
    assert not is_current(out, model)
    out.parent.mkdir()
    out.write_bytes(b"gguf")
    os.utime(weights, (1_000, 1_000))
    os.utime(model / "config.json", (1_000, 1_000))
    assert is_current(out, model)
    os.utime(weights, None)  # the model was made again after the conversion
    os.utime(out, (1_000, 1_000))
    assert not is_current(out, model)


def test_llama_servers_usage_trailer_is_not_counted_as_a_token() -> None:
    # llama-server's streamed /v1/completions: one chunk per token, then a final chunk with the
    # finish reason, empty text and the usage; the output count comes from that usage.
    token = {"choices": [{"text": "ab", "index": 0, "logprobs": None, "finish_reason": None}]}
    final = {
        "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "usage": {"completion_tokens": 7, "prompt_tokens": 30, "total_tokens": 37},
    }
    assert _is_token_chunk(token) and not _is_token_chunk(final)
