"""guidellm and aiperf, as docs/api.md says to run them, against a live stack serving the demo model as
`make run` serves it (named `demo`, from the repository root): each tool's real CLI, the command read
from the docs, with flags of the tool's own appended to bound it in requests and output tokens. Each
must finish with no errored request in its own report file.

The docs name the model `models/demo`: the tools load their tokenizer from the name they send, and the
gateway answers to the model's directory too (openai_frontend/model/path_names.py). aiperf keeps its
default 550-token prompts, which the demo model's 1024 positions hold.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.processes.services import ROOT, Stack, running_stack
from harness.user.load_tools import load_tools_bin, run_tool

API_DOC = ROOT / "docs" / "api.md"
DEMO_DIR = ROOT / "models" / "demo"
TOOL_TIMEOUT_S = 480.0  # both start several Python processes: tens of seconds on 2 busy cores
AIPERF_DEFAULT_ISL = 550


@pytest.fixture(scope="module")
def tools_bin() -> Path:
    return load_tools_bin()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("load-tools-stack"), DEMO_DIR) as stack:
        yield stack


def documented(tool: str) -> str:
    """The bash block of docs/api.md that runs `tool`."""
    blocks = re.findall(rf"```bash\n({tool} .*?)\n```", API_DOC.read_text(), re.S)
    assert len(blocks) == 1, f"docs/api.md gives {len(blocks)} {tool} commands"
    return blocks[0]


def with_more(command: str, option: str, more: str) -> str:
    """`command` with `,more` added to the value of `option`, an option the tool takes only once."""
    pattern = rf"({re.escape(option)} \S+)"
    assert len(re.findall(pattern, command)) == 1, f"{option} in {command!r}"
    return re.sub(pattern, rf"\1,{more}", command)


def run_command(command: str, extra: list[str], stack: Stack, tools_bin: Path, log: Path) -> str:
    env = {
        **os.environ,
        "CBSERVE_URL": stack.base_url,
        "PATH": f"{tools_bin}{os.pathsep}{os.environ['PATH']}",
    }
    full = f"{command} {shlex.join(extra)}"
    return run_tool(["bash", "-euo", "pipefail", "-c", full], env, log, TOOL_TIMEOUT_S)


def test_the_documented_commands_name_the_model_by_its_path() -> None:
    assert "model=models/demo" in documented("guidellm")
    assert "--model models/demo" in documented("aiperf")
    assert "${CBSERVE_URL:-http://127.0.0.1:8000}" in documented("guidellm")
    assert "${CBSERVE_URL:-http://127.0.0.1:8000}" in documented("aiperf")


def test_guidellm_sweep_without_errors(stack: Stack, tools_bin: Path, tmp_path: Path) -> None:
    """The documented sweep cut to three strategies (synchronous, throughput, one constant rate) of
    at most four requests each, at most four at once (setting up its default 512 streams takes
    guidellm tens of seconds a strategy)."""
    per_strategy = 4
    command = with_more(documented("guidellm"), "--profile", f"sweep_size=3,max_concurrency={per_strategy}")
    extra = [
        "--constraint",
        f"kind=max_requests,count={per_strategy}",
        "--output",
        f"kind=json,path={tmp_path / 'benchmarks.json'}",
        "--disable-progress",
    ]
    run_command(command, extra, stack, tools_bin, tmp_path / "guidellm.log")
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    benchmarks = report["benchmarks"]
    assert len(benchmarks) == 3
    for benchmark in benchmarks:
        totals = benchmark["metrics"]["request_totals"]
        assert totals["errored"] == 0, totals
        assert totals["successful"] >= 1, totals
        assert totals["successful"] + totals["incomplete"] <= per_strategy, totals
        outputs = benchmark["metrics"]["output_token_count"]["successful"]
        assert outputs["min"] == outputs["max"] == 128  # the documented output_tokens, exactly


def aiperf_report(artifacts: Path) -> dict[str, Any]:
    (path,) = artifacts.rglob("profile_export_aiperf.json")
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def test_aiperf_default_prompts_without_errors(stack: Stack, tools_bin: Path, tmp_path: Path) -> None:
    """Its default chat requests and 550-token prompts, three of them, each answer cut at 16 tokens."""
    requests = 3
    artifacts = tmp_path / "artifacts"
    extra = ["--request-count", str(requests), "--osl", "16", "--artifact-dir", str(artifacts)]
    extra += ["--ui-type", "none"]
    run_command(documented("aiperf"), extra, stack, tools_bin, tmp_path / "aiperf.log")
    report = aiperf_report(artifacts)
    assert report["error_summary"] == []
    assert report.get("error_request_count", {"avg": 0})["avg"] == 0
    assert report["request_count"]["avg"] == requests
    assert report["was_cancelled"] is False
    assert report["usage_prompt_tokens"]["min"] >= AIPERF_DEFAULT_ISL  # plus the chat template's tokens
    assert report["usage_completion_tokens"]["max"] <= 16
