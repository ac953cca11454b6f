"""The layering rules, read from the source: services never import one another; libraries no service.

`common` and `openai_frontend` are libraries: `common` is what every process shares (the protocol,
stream names, Redis helpers), `openai_frontend` turns OpenAI requests into queued requests and their
tokens back into responses, for the gateway and the Celery batch task alike. Each service runs as its
own process and talks to the others only through Redis, so none imports another's code.

Inside `openai_frontend`, each file sits in a folder that does one job, and the folders form layers:
a folder imports only the folders below it in FRONTEND_LAYERS (and itself), so there is no back-edge
and no circle. In every other package the folders import one another in no circle either, and the
gateway's routes (api/) use its other folders, never the other way round. No gateway folder imports a
module outside it that imports back into it (`app_state.py` holding `generation/`'s pieces while
`generation/` reads `app_state.py`): what both need sits beneath both.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "batcher", "gpu_worker", "cbserve_celery", "cbserve")
# Each library and the top-level packages it may import, besides itself and third-party ones.
LIBRARIES: dict[str, tuple[str, ...]] = {"common": (), "openai_frontend": ("common",)}
PROJECT = (*SERVICES, *LIBRARIES, "benchmarks", "scripts", "tests", "models")
# openai_frontend's job folders, lowest first: each may import those before it, never one after.
FRONTEND_LAYERS = (
    "protocol",  # OpenAI's schemas and error bodies
    "model",  # the served model: tokenizer, chat template
    "text",  # tokens back to text
    "structured",  # response_format / structured_outputs to the worker's constraint
    "tools",  # function tools and their call parsers
    "reasoning",  # a thinking model's thoughts told apart, and grammars that start after them
    "generate",  # a body to a queued request and its record
    "follow",  # submitting and following a request's tokens, and the one stream-out
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


def _imported_modules(path: Path) -> set[str]:
    """The modules this file imports, at any depth (function-level imports too); `from a import b`
    counts as `a` and `a.b` (b may be a module), a relative import as the absolute name it means."""
    found: set[str] = set()
    package = path.relative_to(ROOT).with_suffix("").parts
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: -node.level]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _imported_packages(path: Path) -> set[str]:
    """The project's top-level packages this file imports."""
    return {top for name in _imported_modules(path) if (top := name.split(".")[0]) in PROJECT}


def _violations(package: str, allowed: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {other}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for other in sorted(_imported_packages(path) - {package, *allowed})
    ]


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
    for name, text in {
        "__init__.py": "",
        "state.py": "from gateway.work.guard import Guard\n",
        "work/__init__.py": "",
        "work/guard.py": "",
        "work/flow.py": "from ..state import State\n",
    }.items():
        (tmp_path / "gateway" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "gateway" / name).write_text(text)
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
