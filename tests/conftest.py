"""Fixtures shared by every test: a private redis-server, the tiny model directory, and an `openai`
SDK client of a module's `stack` (tests/services.py `module_stack`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from tests.tiny_model import build_tiny_model

if TYPE_CHECKING:
    import openai

    from tests.redis_cluster import RedisCluster
    from tests.services import Stack

# Triton kernels run under Triton's interpreter on CPU tensors unless the kernel tests are pointed at
# a GPU (CBSERVE_TEST_DEVICE=cuda, as benchmarks/gpu_check.sh does). Triton reads this when a kernel
# is defined, so it is set here, before any test module imports one.
if os.environ.get("CBSERVE_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with room for a tools system prompt (about 500 of its tokens)."""
    return build_tiny_model(tmp_path_factory.mktemp("tool-models") / "tiny-llama", max_len=2048)


@contextlib.contextmanager
def redis_server(data_dir: Path) -> Iterator[str]:
    """A redis-server of the test's own on a free port; never the machine's shared one."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server must be on PATH"
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(data_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise
            time.sleep(0.02)
    try:
        yield url
    finally:
        client.close()
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A Redis Cluster of the test module's own: 3 masters, 3 replicas (tests/redis_cluster.py)."""
    from tests.redis_cluster import redis_cluster

    with redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as c:
        yield c


@pytest.fixture()
def redis_url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path) as url:
        yield url


@pytest.fixture()
def make_stack(redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> Iterator[Callable[[], Stack]]:
    """Builds a Stack of real service processes on the test's Redis; stops every process afterwards."""
    from tests.services import Stack

    stacks: list[Stack] = []

    def make() -> Stack:
        stack = Stack(redis_url=redis_url, model_dir=tiny_model_dir, log_dir=tmp_path)
        stacks.append(stack)
        return stack

    try:
        yield make
    finally:
        for stack in stacks:
            stack.stop()


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    """An `openai` SDK client of the module's `stack` fixture (which the module defines)."""
    with stack.sdk() as c:
        yield c
