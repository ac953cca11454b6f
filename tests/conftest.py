"""Fixtures shared by every test: a private redis-server, the tiny model directory, and an `openai`
SDK client of a module's `stack` (harness/processes/services.py `module_stack`).

Each test is marked by its folder: `unit` (tests/unit/<package>/: starts no service; `make test-fast`
runs these), `stack` (tests/stack/: a live stack, Redis or other processes), `cluster` (tests/cluster/:
a Redis Cluster). A unit test that asks for a fixture starting a service is a collection error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.models.tiny_model import build_tiny_model
from harness.processes.redis_server import redis_server

if TYPE_CHECKING:
    import openai

    from harness.processes.redis_cluster import RedisCluster
    from harness.processes.services import Stack

# Workers run their decoder eagerly here (as by default on the CPU, but also with quantized weights):
# compiling costs seconds to minutes per process. tests/stack/services/test_compiled_forward.py compiles.
os.environ.setdefault("WORKER_COMPILE", "false")
# Triton kernels run under Triton's interpreter on CPU tensors unless the kernel tests are pointed at
# a GPU (CBSERVE_TEST_DEVICE=cuda, as benchmarks/gpu/gpu_check.sh does). Triton reads this when a kernel
# is defined, so it is set here, before any test module imports one.
if os.environ.get("CBSERVE_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")


TESTS = Path(__file__).resolve().parent
# The folder a test lives in gives its marker (registered in pyproject.toml).
FOLDER_MARKERS = {"unit": "unit", "stack": "stack", "cluster": "cluster"}
# Fixtures that start a redis-server, a gateway or a stack: a unit test may not ask for them.
SERVICE_FIXTURES = frozenset(
    {"redis_url", "make_stack", "stack", "cluster", "gateway", "make_gateway", "client"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.resolve().relative_to(TESTS).parts[0]
        if (marker := FOLDER_MARKERS.get(folder)) is None:
            continue
        item.add_marker(marker)
        services = SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if marker == "unit" and services:
            raise pytest.UsageError(
                f"{item.nodeid} is under tests/unit/ but starts a service ({', '.join(sorted(services))}):"
                " move it to tests/stack/"
            )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def lora_adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three random PEFT adapters of the tiny model, by name (harness/models/lora_adapters.py's SPECS)."""
    from harness.models.lora_adapters import build_adapters

    return build_adapters(tiny_model_dir, tmp_path_factory.mktemp("lora-adapters"))


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with room for a tools system prompt (about 500 of its tokens)."""
    return build_tiny_model(tmp_path_factory.mktemp("tool-models") / "tiny-llama", max_len=2048)


@pytest.fixture(scope="session")
def vision_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The tiny vision-language model of a family (harness/models/vision.py VISION_FAMILIES), with its
    processor, built on first use."""
    from harness.models.vision import build_vision_model

    built: dict[str, Path] = {}

    def model_dir(family: str) -> Path:
        if family not in built:
            built[family] = build_vision_model(tmp_path_factory.mktemp("vision-models") / family, family)
        return built[family]

    return model_dir


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A Redis Cluster of the test module's own: 3 masters, 3 replicas
    (harness/processes/redis_cluster.py)."""
    from harness.processes.redis_cluster import redis_cluster

    with redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as c:
        yield c


@pytest.fixture()
def redis_url(tmp_path: Path) -> Iterator[str]:
    with redis_server(tmp_path) as url:
        yield url


@pytest.fixture()
def make_stack(redis_url: str, tiny_model_dir: Path, tmp_path: Path) -> Iterator[Callable[[], Stack]]:
    """Builds a Stack of real service processes on the test's Redis; stops every process afterwards."""
    from harness.processes.services import Stack

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
