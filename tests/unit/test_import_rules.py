"""The layering rules, read from the source: services never import one another; libraries no service.

`common` and `openai_frontend` are libraries: `common` is what every process shares (the protocol,
stream names, Redis helpers), `openai_frontend` turns OpenAI requests into queued requests and their
tokens back into responses, for the gateway and the Celery batch task alike. Each service runs as its
own process and talks to the others only through Redis, so none imports another's code; only a
service's core (`batcher/core/`, the worker's `runner/`) may be driven in-process, by `cbserve`'s
`LLM` and the benchmarks.

The batcher's scheduling core imports no Redis, not even through another module: only its own
modules, `common`'s Redis-free ones and third-party packages. No package has a circle of imports
between its files (Tarjan's strongly connected components over the module graph).

Inside `openai_frontend`, each file sits in a folder that does one job, and the folders form layers:
a folder imports only the folders below it in FRONTEND_LAYERS (and itself), so there is no back-edge
and no circle. In every other package the folders import one another in no circle either, and the
gateway's routes (api/) use its other folders, never the other way round. No gateway folder imports a
module outside it that imports back into it (`app_state.py` holding `generation/`'s pieces while
`generation/` reads `app_state.py`): what both need sits beneath both.
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "batcher", "gpu_worker", "cbserve_celery", "cbserve")
# Each library and the top-level packages it may import, besides itself and third-party ones.
LIBRARIES: dict[str, tuple[str, ...]] = {"common": (), "openai_frontend": ("common",)}
PROJECT = (*SERVICES, *LIBRARIES, "benchmarks", "harness", "scripts", "tests", "models")
# A service's pure core, which an in-process engine drives without the service's process.
SERVICE_CORES: dict[str, tuple[str, ...]] = {
    "batcher": ("batcher.core",),
    # The runner and its kernels, and the settings a worker starts from.
    "gpu_worker": ("gpu_worker.runner", "gpu_worker.kernels", "gpu_worker.settings"),
}
# Who may import a service's core (and nothing else of that service): the in-process `LLM`, the benchmarks.
CORE_USERS = ("cbserve", "benchmarks")
# Packages whose modules must import no Redis client, directly or through a module they import.
REDIS_FREE = ("batcher.core", "gpu_worker.runner", "gpu_worker.kernels")
# openai_frontend's job folders, lowest first: each may import those before it, never one after.
FRONTEND_LAYERS = (
    "protocol",  # OpenAI's schemas and error bodies
    "media",  # images a request carries: fetched, decoded, checked
    "model",  # the served model: tokenizer, chat template
    "text",  # tokens back to text
    "structured",  # response_format / structured_outputs to the worker's constraint
    "tools",  # function tools and their call parsers
    "reasoning",  # a thinking model's thoughts told apart, and grammars that start after them
    "generate",  # a body to a queued request and its record
    "follow",  # submitting and following a request's tokens, and the one stream-out
    "pooling",  # embeddings, scores and classes: their inputs as token ids, their results
    "completions",  # /v1/chat/completions and /v1/completions: their chunks, bodies and logprobs
    "responses",  # the Responses API
    "anthropic",  # the Anthropic Messages API, as chat requests
    "batch",  # the Files and Batch APIs
    "stored",  # stored chat completions (store: true)
)
FRONTEND = ROOT / "openai_frontend"
# The gateway's folders and the folders each may not import: the routes (api/) use the rest, never the
# other way round, and refusing a caller (security/) knows nothing of generation.
GATEWAY_FORBIDDEN: dict[str, tuple[str, ...]] = {
    "security": ("api", "generation"),
    "generation": ("api",),
    "streaming": ("api", "generation"),
    "observability": ("api", "generation"),
    "limits": ("api", "generation", "security"),
}


@functools.cache
def _imports(path: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """This file's imports at any depth (function-level ones too), each as (module, names): `import
    a.b` is ("a.b", ()), `from a import b, c` is ("a", ("b", "c")); a relative import names the
    absolute module it means."""
    found: list[tuple[str, tuple[str, ...]]] = []
    package = path.relative_to(ROOT).with_suffix("").parts
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: -node.level]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.append((module, tuple(alias.name for alias in node.names)))
    return tuple(found)


def _imported_modules(path: Path) -> frozenset[str]:
    """The modules this file imports; `from a import b` counts as `a` and `a.b` (b may be a module)."""
    return frozenset(
        name for module, names in _imports(path) for name in (module, *(f"{module}.{n}" for n in names))
    )


def _imported_packages(path: Path) -> set[str]:
    """The project's top-level packages this file imports."""
    return {top for name in _imported_modules(path) if (top := name.split(".")[0]) in PROJECT}


def _violations(package: str, allowed: tuple[str, ...]) -> list[str]:
    # A user of services' cores is checked module by module (test_a_core_user_imports_only_the_core).
    cores = set(SERVICE_CORES) if package in CORE_USERS else set()
    return [
        f"{path.relative_to(ROOT)} imports {other}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for other in sorted(_imported_packages(path) - {package, *allowed, *cores})
    ]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _outside_cores(user: str) -> list[str]:
    """Each import by `user` of a module of a service with a core that is not in that core."""
    return [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted((ROOT / user).rglob("*.py"))
        for module in sorted(_imported_modules(path))
        if (service := module.split(".")[0]) in SERVICE_CORES
        and service != user
        and not any(_within(module, core) for core in SERVICE_CORES[service])
    ]


@pytest.mark.parametrize("user", CORE_USERS)
def test_a_core_user_imports_only_the_core(user: str) -> None:
    assert _outside_cores(user) == []


def test_the_core_rule_sees_an_import_past_the_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    engine = tmp_path / "cbserve" / "engine.py"
    engine.parent.mkdir(parents=True)
    engine.write_text(
        "from batcher.core.scheduler import Scheduler\nfrom batcher.service.loop import Batcher\n"
    )
    assert _outside_cores("cbserve") == [
        "cbserve/engine.py imports batcher.service.loop",
        "cbserve/engine.py imports batcher.service.loop.Batcher",
    ]
    assert _violations("cbserve", tuple(LIBRARIES)) == []  # the core itself is allowed


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_a_library_imports_no_service(library: str) -> None:
    assert _violations(library, LIBRARIES[library]) == []


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service: str) -> None:
    assert _violations(service, tuple(LIBRARIES)) == []


def test_the_rules_see_an_import() -> None:
    """The scan finds imports at module and function level, so an empty list above means something."""
    assert {"common", "openai_frontend"} <= _imported_packages(ROOT / "cbserve_celery" / "batch_run.py")
    assert "openai_frontend" in _imported_packages(ROOT / "cbserve_celery" / "app.py")


def _frontend_folder(module: str) -> str:
    """`openai_frontend.follow.token_mux` -> `follow`; the package face alone -> ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_frontend_file_is_in_a_job_folder() -> None:
    loose = [p.name for p in FRONTEND.glob("*.py") if p.name != "__init__.py"]
    folders = {p.name for p in FRONTEND.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert loose == []
    assert folders == set(FRONTEND_LAYERS)


def test_frontend_folders_import_only_the_folders_below() -> None:
    back_edges = []
    for path in sorted(FRONTEND.rglob("*.py")):
        folder = path.relative_to(FRONTEND).parts[0]
        if folder == "__init__.py":
            continue
        for module in sorted(_imported_modules(path)):
            if module.split(".")[0] != "openai_frontend":
                continue
            other = _frontend_folder(module)
            if other not in FRONTEND_LAYERS or FRONTEND_LAYERS.index(other) > FRONTEND_LAYERS.index(folder):
                back_edges.append(f"{path.relative_to(ROOT)} ({folder}) imports {module}")
    assert back_edges == []


def test_the_folder_rule_sees_an_import() -> None:
    """The scan reads submodule imports, so an empty list above means something."""
    request_follower = FRONTEND / "follow" / "request_follower.py"
    assert "openai_frontend.generate.request" in _imported_modules(request_follower)
    assert FRONTEND_LAYERS.index("generate") < FRONTEND_LAYERS.index("follow")


@pytest.mark.parametrize("folder", sorted(GATEWAY_FORBIDDEN))
def test_gateway_folders_do_not_import_the_routes(folder: str) -> None:
    forbidden = {f"gateway.{name}" for name in GATEWAY_FORBIDDEN[folder]}
    back_edges = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted((ROOT / "gateway" / folder).rglob("*.py"))
        for module in sorted(_imported_modules(path))
        if any(module == f or module.startswith(f + ".") for f in forbidden)
    ]
    assert back_edges == []


def _folder_imports(package: str) -> dict[str, set[str]]:
    """Each folder of `package` and the other folders of it that its files import. The package's own
    top-level files are left out: they assemble the folders (an app, a runner)."""
    folders = {p.name for p in (ROOT / package).iterdir() if (p / "__init__.py").exists()}
    edges: dict[str, set[str]] = {folder: set() for folder in folders}
    for folder in folders:
        for path in (ROOT / package / folder).rglob("*.py"):
            for module in _imported_modules(path):
                parts = module.split(".")
                if parts[0] == package and len(parts) > 1 and parts[1] in folders - {folder}:
                    edges[folder].add(parts[1])
    return edges


def _circle(edges: dict[str, set[str]]) -> list[str]:
    """A circle of imports among the folders, as the path around it; [] when there is none."""
    done: set[str] = set()

    def walk(folder: str, path: list[str]) -> list[str]:
        if folder in path:
            return [*path[path.index(folder) :], folder]
        if folder in done:
            return []
        for other in sorted(edges[folder]):
            if circle := walk(other, [*path, folder]):
                return circle
        done.add(folder)
        return []

    return next((circle for folder in sorted(edges) if (circle := walk(folder, []))), [])


@pytest.mark.parametrize("package", (*SERVICES, *LIBRARIES))
def test_no_folders_import_each_other_in_a_circle(package: str) -> None:
    assert _circle(_folder_imports(package)) == []


def test_the_circle_rule_sees_a_circle_and_the_folders() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    assert _folder_imports("gateway")["api"] >= {"generation", "security", "streaming"}
    sse_stream = ROOT / "gateway" / "streaming" / "sse_stream.py"
    assert "gateway.streaming.sse" in _imported_modules(sse_stream)


def _module_name(path: Path) -> str:
    """`gateway/limits/rate_limit.py` -> `gateway.limits.rate_limit`; an `__init__.py` -> its package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _plant(root: Path, files: dict[str, str]) -> None:
    """Write each file (a path under `root`: its text) for a rule to read."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _imports_back(package: str) -> list[str]:
    """Each import by a folder of `package` of one of the package's modules outside that folder (a
    top-level file or another folder's) which itself imports a module of that folder."""
    folders = {p.name for p in (ROOT / package).iterdir() if (p / "__init__.py").exists()}
    imports = {_module_name(path): _imported_modules(path) for path in sorted((ROOT / package).rglob("*.py"))}
    found = []
    for module, imported in imports.items():
        parts = module.split(".")
        if len(parts) < 3 or parts[1] not in folders:
            continue  # the package face or a top-level file: not in a folder
        inside = f"{package}.{parts[1]}"
        for other in sorted(imported & imports.keys()):
            if other == inside or other.startswith(inside + "."):
                continue
            back = sorted(
                m for m in imports[other] & imports.keys() if m == inside or m.startswith(inside + ".")
            )
            if back:
                found.append(f"{module} imports {other}, which imports back {', '.join(back)}")
    return found


def test_no_gateway_folder_imports_a_module_that_imports_it_back() -> None:
    assert _imports_back("gateway") == []


def test_the_import_back_rule_sees_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    _plant(
        tmp_path / "gateway",
        {
            "__init__.py": "",
            "state.py": "from gateway.work.guard import Guard\n",
            "work/__init__.py": "",
            "work/guard.py": "",
            "work/flow.py": "from ..state import State\n",
        },
    )
    assert _imports_back("gateway") == [
        "gateway.work.flow imports gateway.state, which imports back gateway.work.guard"
    ]


def test_a_relative_import_counts_as_the_module_it_means(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    auth = tmp_path / "gateway" / "security" / "auth.py"
    auth.parent.mkdir(parents=True)
    auth.write_text("from ..api import routes_files\nfrom . import quotas\n")
    assert {"gateway.api", "gateway.api.routes_files", "gateway.security.quotas"} <= _imported_modules(auth)


def _module_paths(packages: Iterable[str]) -> dict[str, Path]:
    """Each module of `packages` (a package's `__init__` named as the package) and its file."""
    paths = (path for package in packages for path in sorted((ROOT / package).rglob("*.py")))
    return {_module_name(path): path for path in paths}


def _module_imports(packages: Iterable[str]) -> dict[str, frozenset[str]]:
    """Each module of `packages` and what it imports."""
    return {module: _imported_modules(path) for module, path in _module_paths(packages).items()}


def _module_graph(packages: Iterable[str]) -> dict[str, set[str]]:
    """Each module of `packages` and the project modules it imports, at module or function level;
    third-party modules are left out. `from a import b` imports module `a.b` where there is one, and
    `a` (its `__init__`) only for a name that `a` defines: importing a.b runs a's `__init__` first
    whatever the statement, which is no edge, or every package would import its own submodules."""
    paths = _module_paths(packages)
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        edges: set[str] = set()
        for imported, names in _imports(path):
            submodules = {f"{imported}.{name}" for name in names} & paths.keys()
            edges |= submodules
            if len(submodules) < len(names) or not names:
                edges.add(imported)
        graph[module] = (edges & paths.keys()) - {module}
    return graph


def _redis_path(module: str, imports: dict[str, frozenset[str]]) -> list[str]:
    """The shortest chain of project modules by which importing `module` imports a Redis client,
    ending in "redis"; [] when it does not."""
    parents: dict[str, str] = {}
    queue = deque([module])
    while queue:
        current = queue.popleft()
        if any(name.split(".")[0] == "redis" for name in imports[current]):
            chain = [current, "redis"]
            while chain[0] != module:
                chain.insert(0, parents[chain[0]])
            return chain
        for other in sorted(imports[current] & imports.keys()):
            if other != module and other not in parents:
                parents[other] = current
                queue.append(other)
    return []


def _impure_core_files(core: str) -> list[str]:
    """Each import by a module of `core` that is neither its service's core (SERVICE_CORES), a
    Redis-free module of `common`, nor a third-party package other than Redis."""
    imports = _module_imports(PROJECT)
    service_core = SERVICE_CORES[core.split(".")[0]]
    found = []
    for module in sorted(m for m in imports if _within(m, core)):
        for imported in sorted(imports[module]):
            top = imported.split(".")[0]
            if top == "redis":
                found.append(f"{module} imports {imported}")
            elif top in PROJECT and not (any(_within(imported, c) for c in service_core) or top == "common"):
                found.append(f"{module} imports {imported}, outside {core}")
            elif imported in imports and (chain := _redis_path(imported, imports)):
                found.append(f"{module} imports Redis through {' -> '.join(chain)}")
    return found


@pytest.mark.parametrize("core", REDIS_FREE)
def test_a_core_imports_no_redis(core: str) -> None:
    assert _impure_core_files(core) == []


def test_the_redis_rule_catches_a_planted_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    _plant(
        tmp_path,
        {
            "common/redis_io/__init__.py": "",
            "common/__init__.py": "",
            "common/protocol.py": "import msgspec\n",
            "common/redis_io/redis_conn.py": "import redis\n",
            "common/streams.py": "from common.redis_io import redis_conn\n",
            "batcher/__init__.py": "",
            "batcher/core/__init__.py": "",
            "batcher/core/pure.py": "import math\nfrom common.protocol import X\nfrom . import clean\n",
            "batcher/core/clean.py": "from collections import deque\n",
            "batcher/core/direct.py": "def f():\n    import redis.asyncio\n",
            "batcher/core/through.py": "from common.streams import cell_keys\n",
            "batcher/core/service.py": "from ..service.loop import Batcher\n",
            "batcher/service/__init__.py": "",
            "batcher/service/loop.py": "",
        },
    )
    assert _impure_core_files("batcher.core") == [
        "batcher.core.direct imports redis.asyncio",
        "batcher.core.service imports batcher.service.loop, outside batcher.core",
        "batcher.core.service imports batcher.service.loop.Batcher, outside batcher.core",
        "batcher.core.through imports Redis through common.streams -> common.redis_io.redis_conn -> redis",
    ]


def _circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each as its
    sorted modules: every module of one imports every other, through the others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[tuple[str, ...]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(tuple(sorted(component)))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


def test_no_package_has_a_circle_of_imports_between_its_files() -> None:
    assert _circles(_module_graph(PROJECT)) == []


def test_the_circle_rule_sees_a_circle_between_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}) == [("a", "b", "c")]
    assert _circles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    _plant(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.c import C\nfrom pkg.d import D\n",
            "pkg/a.py": "from pkg.b import B\n",
            "pkg/b.py": "def later():\n    from . import a\n",  # a function-level import counts too
            "pkg/c.py": "from pkg import a\n",  # module pkg.a: pkg's __init__ only runs first
            "pkg/d.py": "from pkg import C\n",  # a name pkg's __init__ defines: it imports the __init__
        },
    )
    assert _circles(_module_graph(["pkg"])) == [("pkg", "pkg.d"), ("pkg.a", "pkg.b")]
